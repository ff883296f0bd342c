"""IterDataset: the chained style is a DataLoader; states, refusals and options."""

from __future__ import annotations

import json

import pytest

import dataloader as dl
from tests.dataloader.dataset.pipelines import everything_chained, everything_loader
from tests.helpers import assert_restores_everywhere, assert_streams_equal, take


def test_chained_style_and_data_loader_give_the_same_batches():
    assert_streams_equal(list(everything_chained()), list(everything_loader()))


def test_chained_style_and_data_loader_give_the_same_states():
    chained, loader = iter(everything_chained()), iter(everything_loader())
    for _ in range(5):
        next(chained), next(loader)
        assert chained.get_state() == loader.get_state()


def test_a_data_loader_state_restores_into_the_chained_style():
    loader = iter(everything_loader())
    take(loader, 3)
    state = json.dumps(loader.get_state())
    chained = iter(everything_chained())
    chained.set_state(json.loads(state))
    assert_streams_equal(take(chained, 4), take(loader, 4))


def test_state_of_another_mixture_is_refused_naming_the_index_map():
    def mixed(weights):
        parts = [dl.MapDataset.range(10).repeat(), dl.MapDataset.range(20, 30).repeat()]
        return dl.MapDataset.mix(parts, weights).to_iter_dataset()

    it = iter(mixed([0.3, 0.7]))
    next(it)
    other = iter(mixed([0.5, 0.5]))
    with pytest.raises(dl.StateMismatchError, match=r"index_map=.*100/333.* but this loader has index_map=.*100/200"):
        other.set_state(it.get_state())


def test_state_of_another_seed_is_refused():
    it = iter(dl.MapDataset.range(10).seed(1).shuffle().to_iter_dataset())
    next(it)
    with pytest.raises(dl.StateMismatchError, match="seed=1 but this loader has seed=2"):
        iter(dl.MapDataset.range(10).seed(2).shuffle().to_iter_dataset()).set_state(it.get_state())


def test_shard_options_interleave_the_stream_like_a_slice():
    ds = dl.MapDataset.range(20).seed(3).shuffle()
    sharded = list(ds.to_iter_dataset(shard_options=dl.ShardOptions(1, 4)))
    assert sharded == list(ds[1::4])


def test_sharded_batches_restore_elastically_on_another_shard_count():
    ds = dl.MapDataset.range(48).seed(3).shuffle()
    two = [iter(ds.to_iter_dataset(shard_options=dl.ShardOptions(h, 2)).batch(4)) for h in range(2)]
    for it in two:
        take(it, 2)
    four = iter(ds.to_iter_dataset(shard_options=dl.ShardOptions(0, 4)).batch(2))
    four.set_state(two[0].get_state())
    assert four.get_state()["position"] == 4


def test_sharded_mixture_restores_elastically_on_another_shard_count():
    mixed = dl.MapDataset.mix(
        [dl.MapDataset.range(10).seed(1).shuffle().repeat(), dl.MapDataset.range(100, 105).seed(2).shuffle().repeat()],
        [0.3, 0.7],
    )

    def shard(h, count, batch_size):
        return mixed.to_iter_dataset(shard_options=dl.ShardOptions(h, count)).batch(batch_size)

    assert type(shard(0, 2, 4).loader.sampler).__name__ == "IndexMapSampler"
    two = [iter(shard(h, 2, 4)) for h in range(2)]
    for it in two:
        take(it, 2)
    state = two[0].get_state()
    four = [iter(shard(h, 4, 2)) for h in range(4)]
    for it in four:
        it.set_state(state)
    expected = sorted(mixed[16:24])  # global positions 16..23: the third global batch of 8
    assert sorted(x for it in two for x in next(it).tolist()) == expected
    assert sorted(x for it in four for x in next(it).tolist()) == expected


def test_a_second_batch_nests_batches_at_the_iterator_level_and_restores():
    ds = dl.MapDataset.range(10).batch(2).to_iter_dataset().batch(2)
    assert [b.tolist() for b in ds] == [[[0, 1], [2, 3]], [[4, 5], [6, 7]], [[8, 9]]]
    assert_restores_everywhere(lambda: iter(ds))


def test_iter_filter_then_batch_regroups_survivors():
    ds = dl.MapDataset.range(12).to_iter_dataset().filter(lambda x: x % 3 != 0).batch(3)
    assert [b.tolist() for b in ds] == [[1, 2, 4], [5, 7, 8], [10, 11]]


def test_iter_mix_of_batched_streams_mixes_the_batches_as_in_grain():
    a = dl.MapDataset.range(4).to_iter_dataset().batch(2)
    b = dl.MapDataset.range(10, 16).to_iter_dataset().batch(2)
    assert [x.tolist() for x in dl.IterDataset.mix([a, b])] == [[0, 1], [10, 11], [2, 3], [12, 13]]


def test_prefetch_threads_do_not_change_the_output():
    ds = dl.MapDataset.range(40).seed(2).shuffle().batch(4).to_iter_dataset()
    assert_streams_equal(list(ds.prefetch(3)), list(ds))
    assert ds.prefetch(3).loader.read_options.num_threads == 1


def test_grain_style_prefetch_with_multiprocessing_options_is_mp_prefetch():
    ds = dl.MapDataset.range(4).to_iter_dataset()
    assert ds.prefetch(dl.MultiprocessingOptions(num_workers=3)).loader.worker_count == 3


def test_multiprocessing_options_validate_their_fields():
    with pytest.raises(ValueError, match=r'MultiprocessingOptions.num_workers must be an integer >= 0 or "auto", got -1; .*pass num_workers="auto"'):
        dl.MultiprocessingOptions(num_workers=-1)
    with pytest.raises(ValueError, match=r"per_worker_buffer_size must be an integer >= 1, got 0"):
        dl.MultiprocessingOptions(per_worker_buffer_size=0)
