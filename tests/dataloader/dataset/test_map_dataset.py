"""MapDataset: lazy random access, lengths, index-level calls, seeds and errors."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import dataloader as dl
from tests.helpers import assert_restores_everywhere


def test_source_and_range_read_records_in_order():
    assert list(dl.MapDataset.source(["a", "b", "c"])) == ["a", "b", "c"]
    assert list(dl.MapDataset.range(2, 11, 3)) == [2, 5, 8]


def test_getitem_computes_one_element_lazily():
    calls = []
    ds = dl.MapDataset.range(100).map(lambda x: calls.append(x) or x * 2)
    assert ds[42] == 84
    assert calls == [42]


def test_shuffle_is_the_index_sampler_permutation_of_the_same_seed():
    ds = dl.MapDataset.range(50).seed(9).shuffle()
    expected = dl.IndexSampler(50, shuffle=True, seed=9, num_epochs=1).record_keys(np.arange(50))
    assert list(ds) == expected.tolist()


def test_shuffle_then_repeat_reshuffles_each_epoch():
    ds = dl.MapDataset.range(20).seed(3).shuffle().repeat(2)
    first, second = list(ds)[:20], list(ds)[20:]
    assert sorted(first) == sorted(second) == list(range(20))
    assert first != second


def test_second_shuffle_in_a_chain_derives_its_own_seed():
    once = dl.MapDataset.range(30).seed(3).shuffle()
    twice = once.shuffle()
    assert twice._node.seed != once._node.seed
    assert sorted(twice) == list(range(30))


def test_repeat_none_is_infinite_and_len_is_maxsize():
    ds = dl.MapDataset.range(5).repeat()
    assert len(ds) == sys.maxsize
    assert ds[11111] == 1


def test_slice_and_subscript_slice_select_the_same_elements():
    ds = dl.MapDataset.range(10)
    assert list(ds.slice(slice(1, 8, 3))) == list(ds[1:8:3]) == [1, 4, 7]
    assert list(ds[::-1]) == list(range(9, -1, -1))


def test_slice_of_an_infinite_dataset_can_be_finite():
    ds = dl.MapDataset.range(4).repeat()[2:9]
    assert list(ds) == [2, 3, 0, 1, 2, 3, 0]


def test_filter_leaves_none_at_random_access_and_skips_when_iterating():
    ds = dl.MapDataset.range(6).filter(lambda x: x % 2 == 0)
    assert [ds[i] for i in range(6)] == [0, None, 2, None, 4, None]
    assert list(ds) == [0, 2, 4]


def test_batch_length_and_items_with_and_without_remainder():
    ds = dl.MapDataset.range(10)
    assert len(ds.batch(4)) == 3 and ds.batch(4)[2].tolist() == [8, 9]
    assert len(ds.batch(4, drop_remainder=True)) == 2
    assert [b.tolist() for b in ds.batch(4, drop_remainder=True)] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_batch_fn_is_used_for_every_batch():
    ds = dl.MapDataset.range(5).batch(2, batch_fn=lambda xs: sum(xs))
    assert list(ds) == [1, 5, 4]


def test_shuffling_batches_keeps_each_batch_whole():
    ds = dl.MapDataset.range(10).batch(3).seed(1).shuffle()
    got = sorted(tuple(b.tolist()) for b in ds)
    assert got == [(0, 1, 2), (3, 4, 5), (6, 7, 8), (9,)]


def test_filtered_batches_stay_dropped_after_a_shuffle():
    ds = dl.MapDataset.range(12).batch(3).filter(lambda b: int(b[0]) % 2 == 0).seed(1).shuffle()
    assert sorted(b.tolist() for b in ds) == [[0, 1, 2], [6, 7, 8]]
    assert sum(ds[i] is None for i in range(len(ds))) == 2


def test_batch_of_batches_nests():
    ds = dl.MapDataset.range(8).batch(2).batch(2)
    assert ds[1].tolist() == [[4, 5], [6, 7]]


def test_map_after_shuffle_equals_shuffle_after_map():
    a = dl.MapDataset.range(20).map(lambda x: x * 3).seed(5).shuffle()
    b = dl.MapDataset.range(20).seed(5).shuffle().map(lambda x: x * 3)
    assert list(a) == list(b)


def test_random_map_depends_on_seed_position_and_operation_only():
    ds = dl.MapDataset.range(10).seed(4).random_map(lambda x, rng: rng.random())
    assert ds[3] == dl.record_rng(4, 3, 0, 0).random()
    assert list(ds) == [dl.record_rng(4, g, 0, 0).random() for g in range(10)]


def test_random_map_explicit_seed_overrides_the_chain_seed():
    ds = dl.MapDataset.range(4).seed(4).random_map(lambda x, rng: rng.random(), seed=8)
    assert ds[1] == dl.record_rng(8, 1, 0, 0).random()


@pytest.mark.parametrize(
    "build",
    [
        lambda: dl.MapDataset.mix(
            [dl.MapDataset.range(7).map(lambda x: -x).seed(1).shuffle(), dl.MapDataset.range(10, 19)],
            [2, 3],
        ).repeat(2),
        lambda: dl.MapDataset.concatenate([dl.MapDataset.range(5), dl.MapDataset.range(9).batch(2)[::2]]),
        lambda: dl.MapDataset.range(12).batch(3).seed(2).shuffle().repeat(2).map(lambda b: b * 2).batch(2),
    ],
    ids=["mix_with_component_map", "concatenate_with_sliced_batches", "batch_of_shuffled_batches"],
)
def test_random_access_equals_iteration(build):
    ds = build()
    indexed = [ds[i] for i in range(len(ds))]
    streamed = list(ds)
    assert len(indexed) == len(streamed)
    for a, b in zip(indexed, streamed):
        assert np.array_equal(np.asarray(a), np.asarray(b))


def test_random_map_with_its_own_seed_needs_no_chain_seed():
    ds = dl.MapDataset.range(4).random_map(lambda x, rng: rng.random(), seed=3)
    assert list(ds) == [dl.record_rng(3, g, 0, 0).random() for g in range(4)]


def test_repr_reads_like_the_chain():
    ds = dl.MapDataset.range(4).seed(1).shuffle().batch(2)
    assert repr(ds).startswith("MapDataset.source(RangeDataSource(")
    assert ".shuffle(seed=1).apply(Batch(2" in repr(ds)


def test_dataset_is_a_random_access_source_for_a_data_loader():
    ds = dl.MapDataset.range(6).map(lambda x: x + 100)
    loader = dl.DataLoader(ds, dl.SequentialSampler(len(ds)), [dl.Batch(3)])
    assert [b.tolist() for b in loader] == [[100, 101, 102], [103, 104, 105]]


def test_shuffle_without_a_seed_says_how_to_give_one():
    with pytest.raises(ValueError, match=r"shuffle\(\) needs a seed; call \.seed\(\.\.\.\)"):
        dl.MapDataset.range(5).shuffle()


def test_random_map_without_a_seed_says_how_to_give_one():
    with pytest.raises(ValueError, match=r"needs a seed .* call \.seed\(\.\.\.\) earlier"):
        dl.MapDataset.range(5).random_map(lambda x, rng: x)


def test_batch_after_filter_points_to_to_iter_dataset():
    with pytest.raises(ValueError, match=r"after a filter .* ds\.to_iter_dataset\(\)\.batch"):
        dl.MapDataset.range(5).filter(lambda x: x > 1).seed(1).shuffle().batch(2)


def test_shuffle_of_an_infinite_dataset_is_refused():
    with pytest.raises(ValueError, match=r"cannot shuffle an infinite dataset .* shuffle before repeat"):
        dl.MapDataset.range(5).repeat().shuffle(seed=1)


def test_repeat_of_an_infinite_dataset_is_refused():
    with pytest.raises(ValueError, match="cannot repeat an infinite dataset"):
        dl.MapDataset.range(5).repeat().repeat()


@pytest.mark.parametrize("empty", [
    lambda ds: ds[5:2], lambda ds: ds[10:], lambda ds: ds.seed(1).shuffle()[4:4].map(lambda x: x),
    lambda ds: ds[3::20][1:],
])
def test_an_empty_slice_is_an_empty_dataset_as_in_grain(empty):
    ds = empty(dl.MapDataset.range(10))
    assert len(ds) == 0 and list(ds) == [] and list(ds.to_iter_dataset().batch(2)) == []
    with pytest.raises(IndexError, match=r"index 0 of an empty dataset"):
        ds[0]


def test_a_shard_with_no_element_yields_nothing():
    assert list(dl.MapDataset.range(3).to_iter_dataset(shard_options=dl.ShardOptions(5, 10))) == []


def test_indexing_past_the_end_reads_on_into_the_next_epoch_as_in_grain():
    ds = dl.MapDataset.range(5).seed(1).shuffle()
    first, second = [ds[i] for i in range(5)], [ds[i] for i in range(5, 10)]
    assert sorted(first) == sorted(second) == [0, 1, 2, 3, 4] and first != second
    assert [ds[i] for i in range(5, 10)] == list(ds.repeat(2))[5:]
    assert dl.MapDataset.range(10)[2:5][4] == 3  # epoch 1 of the slice: parent index 2 + 1 + 10


def test_batches_past_the_end_keep_each_epochs_layout():
    ds = dl.MapDataset.range(5).batch(2)
    assert [ds[i].tolist() for i in range(3, 6)] == [[0, 1], [2, 3], [4]]
    dropped = dl.MapDataset.range(5).batch(2, drop_remainder=True)
    assert [dropped[i].tolist() for i in range(2, 4)] == [[0, 1], [2, 3]]


def test_a_negative_index_is_refused():
    with pytest.raises(IndexError, match=r"index -1 is negative; dataset indices count from 0"):
        dl.MapDataset.range(10)[-1]


def test_passing_a_filter_to_map_is_refused():
    with pytest.raises(TypeError, match=r"map\(\) got a FilterTransform"):
        dl.MapDataset.range(3).map(dl.FilterTransform(lambda x: True))


def test_empty_source_is_an_empty_dataset_as_in_grain():
    ds = dl.MapDataset.source([])
    assert len(ds) == 0 and list(ds) == []
    with pytest.raises(IndexError, match="empty dataset"):
        ds[0]


def test_concatenate_of_an_infinite_dataset_is_refused():
    with pytest.raises(ValueError, match=r"dataset 1 .* is infinite; concatenate finite datasets"):
        dl.MapDataset.concatenate([dl.MapDataset.range(2), dl.MapDataset.range(2).repeat()])


def _copies(x):
    return [x * 10 + j for j in range(x % 3)]


def test_flat_map_lays_out_max_fan_out_slots_per_element_as_grain_does():
    ds = dl.MapDataset.range(5).flat_map(dl.FlatMapTransform(_copies, max_fan_out=2))
    assert len(ds) == 10
    assert [ds[i] for i in range(10)] == [None, None, 10, None, 20, 21, None, None, 40, None]
    assert list(ds) == [10, 20, 21, 40]


def test_flat_map_then_index_level_calls_and_iteration_restore_at_every_step():
    ds = (dl.MapDataset.range(30).seed(2).shuffle()
          .flat_map(dl.FlatMapTransform(_copies, max_fan_out=2)).seed(3).shuffle()
          .to_iter_dataset().batch(3))
    values = sorted(int(v) for b in ds for v in b.tolist())
    assert values == sorted(v for x in range(30) for v in _copies(x))
    assert_restores_everywhere(lambda: iter(ds), limit=20)


def test_flat_map_refuses_a_transform_without_max_fan_out():
    with pytest.raises(ValueError, match=r"needs max_fan_out: random access lays out max_fan_out slots"):
        dl.MapDataset.range(3).flat_map(lambda x: [x])


def test_flat_map_producing_more_than_max_fan_out_names_the_counts():
    ds = dl.MapDataset.range(5).flat_map(dl.FlatMapTransform(_copies, max_fan_out=1))
    with pytest.raises(dl.PipelineError, match=r"produced 2 elements from one input, more than max_fan_out=1"):
        ds[2]


@pytest.mark.parametrize("seed", [-1, -(2**40)])
def test_negative_seeds_are_refused(seed):
    with pytest.raises(ValueError, match=r"must be a non-negative integer"):
        dl.MapDataset.range(3).seed(seed)
    with pytest.raises(ValueError, match=r"must be a non-negative integer"):
        dl.MapDataset.range(3).shuffle(seed=seed)


def test_read_options_accept_no_prefetch_as_grain_does():
    options = dl.ReadOptions(num_threads=2, prefetch_buffer_size=0)
    ds = dl.MapDataset.range(20).map(lambda x: x * 2).to_iter_dataset(read_options=options)
    assert list(ds) == [x * 2 for x in range(20)]
