"""ElasticIterator: Grain's constructor and state, restored on other shard counts."""

from __future__ import annotations

import json

import numpy as np
import pytest

import dataloader as dl
from dataloader.experimental import ElasticIterator
from tests.dataloader.dataset.experimental.streams import Counted


def dataset(seed=3):
    return dl.MapDataset.range(48).seed(seed).shuffle().map(lambda x: x * 10)


def shards(ds, global_batch, count):
    return [ElasticIterator(ds, global_batch, dl.ShardOptions(h, count)) for h in range(count)]


def global_batches(iterators, steps):
    """The union of the shards' batches at each step, as sorted lists."""
    out = []
    for _ in range(steps):
        out.append(sorted(np.concatenate([next(it) for it in iterators]).tolist()))
    return out


def test_shards_split_each_global_batch_and_agree_on_the_state():
    reference = global_batches(shards(dataset(), 12, 1), 4)
    iterators = shards(dataset(), 12, 3)
    assert global_batches(iterators, 2) == reference[:2]
    assert all(len(b) == 12 for b in reference)
    states = [json.loads(json.dumps(it.get_state())) for it in iterators]
    assert states[0] == states[1] == states[2]
    assert states[0]["global_next_index"] == 24


@pytest.mark.parametrize(("saved_on", "restored_on"), [(2, 3), (3, 1), (2, 4), (4, 2)])
def test_any_shards_state_restores_every_shard_of_another_count(saved_on, restored_on):
    reference = global_batches(shards(dataset(), 12, 1), 4)
    old = shards(dataset(), 12, saved_on)
    global_batches(old, 2)
    state = json.loads(json.dumps(old[-1].get_state()))
    new = shards(dataset(), 12, restored_on)
    for it in new:
        it.set_state(state)
    assert global_batches(new, 2) == reference[2:]


def restored(global_batch, count, state):
    """Every shard of ``count`` with ``global_batch``, restored from ``state``."""
    new = shards(dataset(), global_batch, count)
    for it in new:
        it.set_state(state)
    return new


@pytest.mark.parametrize(("global_batch", "count"), [(8, 4), (10, 5)], ids=["divides", "does not divide"])
def test_a_restore_may_change_the_global_batch_size_and_the_shard_count(global_batch, count):
    """Shard h of H' goes on at n + h, n + h + H', ... (Grain's slices): where H' does not
    divide n (24 over 5 shards) on an elastic layout whose frontier is n."""
    old = shards(dataset(), 12, 2)
    global_batches(old, 2)
    new = restored(global_batch, count, old[0].get_state())
    order = list(dataset())
    assert global_batches(new, 2) == [sorted(order[24 + global_batch * k : 24 + global_batch * (k + 1)]) for k in range(2)]
    state = json.loads(json.dumps(new[-1].get_state()))
    assert state["global_next_index"] == 24 + 2 * global_batch
    assert global_batches(restored(4, 2, state), 1) == [sorted(order[state["global_next_index"]:][:4])]


def test_grains_state_with_only_the_index_is_accepted():
    reference = global_batches(shards(dataset(), 6, 1), 3)
    restored = shards(dataset(), 6, 2)
    for r in restored:
        r.set_state({"global_next_index": 12})
    assert global_batches(restored, 1) == reference[2:3]


def test_a_state_of_another_dataset_is_refused():
    it = ElasticIterator(dataset(seed=3), 6, dl.ShardOptions(0, 2))
    next(it)
    other = ElasticIterator(dataset(seed=4), 6, dl.ShardOptions(0, 3))
    with pytest.raises(dl.StateMismatchError, match=r"seed=3 but this loader has seed=4"):
        other.set_state(it.get_state())


def test_an_engine_stream_with_maps_is_accepted():
    ds = dl.MapDataset.range(20).to_iter_dataset().map(lambda x: -x)
    it = ElasticIterator(ds, 4, dl.ShardOptions(1, 2))
    assert next(it).tolist() == [-1, -3]


def test_what_it_cannot_make_elastic_is_refused():
    shard = dl.ShardOptions(0, 2)
    with pytest.raises(ValueError, match=r"global batch size 5 is not divisible by shard count 2"):
        ElasticIterator(dataset(), 5, shard)
    with pytest.raises(ValueError, match=r"does not support `filter` transformation"):
        ElasticIterator(dataset().filter(lambda x: x > 3), 4, shard)
    with pytest.raises(ValueError, match=r"batches the dataset itself; pass it unbatched"):
        ElasticIterator(dataset().batch(2), 4, shard)
    with pytest.raises(ValueError, match=r"batches the dataset itself; pass it unbatched"):
        ElasticIterator(dataset().to_iter_dataset().batch(2), 4, shard)
    with pytest.raises(ValueError, match=r"pass it unsharded"):
        ElasticIterator(dataset().to_iter_dataset(shard_options=shard), 4, shard)
    with pytest.raises(ValueError, match=r"no elastic path for other IterDatasets"):
        ElasticIterator(Counted([1, 2]), 2, shard)
    with pytest.raises(ValueError, match=r"global_batch_size must be a positive integer, got 0"):
        ElasticIterator(dataset(), 0, shard)
    with pytest.raises(TypeError, match=r"shard_options must be a ShardOptions, got \(0, 2\)"):
        ElasticIterator(dataset(), 4, (0, 2))
    with pytest.raises(NotImplementedError, match="get_shard_states is only supported for IterDataset-based"):
        ElasticIterator(dataset(), 4, shard).get_shard_states()
