"""A state refuses a loader it does not fit, and restores elastically where it can."""

from __future__ import annotations

import numpy as np
import pytest

import dataloader as dl
from tests.helpers import assert_streams_equal


def loader(n=40, seed=1, shard=(0, 1), batch=4, ops=None, shuffle=True):
    ops = ops if ops is not None else [dl.MapTransform(lambda x: x), dl.Batch(batch)]
    sampler = dl.IndexSampler(n, shard_options=dl.ShardOptions(*shard), shuffle=shuffle, seed=seed)
    return dl.DataLoader(dl.RangeDataSource(100), sampler, ops)


def state_after(ld, steps):
    it = iter(ld)
    for _ in range(steps):
        next(it)
    return it.get_state()


@pytest.mark.parametrize(("other", "message"), [
    (lambda: loader(n=50), r"num_records=40 but this loader has num_records=50 \(restore into a loader over the same data"),
    (lambda: loader(seed=2), r"seed=1 but this loader has seed=2"),
    (lambda: loader(shuffle=False, seed=1), r"shuffle=True but this loader has shuffle=False"),
    (lambda: loader(ops=[dl.MapTransform(abs), dl.Batch(4)]), r"operations=\[.*MapTransform\(.*<lambda>\).*\] but this loader has operations=\[.*MapTransform\(abs\)"),
])
def test_state_refuses_a_loader_it_was_not_made_for(other, message):
    state = state_after(loader(), 3)
    with pytest.raises(dl.StateMismatchError, match=message):
        iter(other()).set_state(state)


def test_state_refuses_another_shard_index():
    state = state_after(loader(shard=(0, 2)), 2)
    with pytest.raises(dl.StateMismatchError, match=r"shard_index=0 but this loader is shard 1"):
        iter(loader(shard=(1, 2))).set_state(state)


def test_state_refuses_a_different_global_batch_and_says_which_fits():
    state = state_after(loader(shard=(0, 2), batch=4), 2)
    with pytest.raises(dl.StateMismatchError, match=r"the global batch must stay the same, so use batch_size=2 on 4 shards"):
        iter(loader(shard=(0, 4), batch=4)).set_state(state)


def test_elastic_restore_is_refused_with_a_filter_before_the_batch():
    ops = lambda b: [dl.FilterTransform(lambda x: x % 2 == 0), dl.Batch(b)]  # noqa: E731
    state = state_after(loader(shard=(0, 2), ops=ops(4)), 2)
    with pytest.raises(dl.StateMismatchError, match=r"needs a plain Batch with no filter or flat map before it"):
        iter(loader(shard=(0, 1), ops=ops(8))).set_state(state)


def test_mismatch_is_refused_at_construction_of_an_iterator_from_a_state():
    state = state_after(loader(), 1)
    with pytest.raises(dl.StateMismatchError, match=r"num_records=40"):
        loader(n=41).iterator(state)


def test_garbage_and_future_versions_are_refused():
    with pytest.raises(dl.StateMismatchError, match=r"expected a state dict from get_state\(\), got list"):
        iter(loader()).set_state([1, 2])
    state = state_after(loader(), 1)
    state["version"] = 99
    with pytest.raises(dl.StateMismatchError, match=r"state version 99 is not supported"):
        iter(loader()).set_state(state)


def test_num_epochs_may_grow_between_save_and_restore():
    short = dl.DataLoader(dl.RangeDataSource(10), dl.IndexSampler(10, shuffle=True, seed=3, num_epochs=1), [dl.Batch(5)])
    longer = dl.DataLoader(dl.RangeDataSource(10), dl.IndexSampler(10, shuffle=True, seed=3, num_epochs=3), [dl.Batch(5)])
    state = state_after(short, 2)
    it = longer.iterator(state)
    rest = [b.tolist() for b in it]
    assert rest == [b.tolist() for b in longer][2:]


@pytest.mark.parametrize(("h0", "h1"), [(2, 1), (2, 4), (4, 2), (1, 2)])
def test_elastic_restore_keeps_the_global_batches(h0, h1):
    global_batch = 8

    def shard_batches(h_count, state=None, steps=None):
        per = []
        for h in range(h_count):
            ld = loader(n=37, shard=(h, h_count), batch=global_batch // h_count)
            it = ld.iterator(state) if state is not None else iter(ld)
            per.append([set(next(it).tolist()) for _ in range(steps)])
        return per

    def global_batches(per):
        return [set().union(*(p[k] for p in per)) for k in range(len(per[0]))]

    reference = global_batches(shard_batches(1, steps=12))
    before = shard_batches(h0, steps=5)
    assert global_batches(before) == reference[:5]
    # Every host's state is at the same local position; restore from host 0's.
    ld0 = loader(n=37, shard=(0, h0), batch=global_batch // h0)
    it0 = iter(ld0)
    for _ in range(5):
        next(it0)
    after = shard_batches(h1, state=it0.get_state(), steps=7)
    assert global_batches(after) == reference[5:]


def test_elastic_restore_maps_the_position():
    state = state_after(loader(shard=(0, 2), batch=4), 3)
    assert state["position"] == 12
    it = loader(shard=(1, 4), batch=2).iterator(state)
    assert it.get_state()["position"] == 6


def test_restored_iterator_continues_identically_after_epoch_boundary():
    ld = dl.DataLoader(dl.RangeDataSource(12), dl.IndexSampler(12, shuffle=True, seed=9, num_epochs=4), [dl.Batch(4)])
    full = list(ld)
    state = state_after(ld, 3)  # exactly one epoch
    assert state["position"] == 12
    assert_streams_equal(list(ld.iterator(state)), full[3:])
    assert np.array_equal(np.sort(np.concatenate(full[:3])), np.arange(12))
