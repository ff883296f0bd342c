"""Behaviours that Grain's own dataset tests pin down, checked on granary.

Each test makes the calls a Grain user makes (``slice`` with a list of indices, seeds of
any size, ``get_next_index``/``set_next_index`` on thread prefetch, interleave and limit,
``ThreadPrefetchDatasetIterator`` built by hand, empty datasets, the filter thresholds)
and checks the result against what Grain gives.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

import dataloader as dl
from dataloader import experimental as ge

# -- slice with a sequence of indices ----------------------------------------------------


def test_slice_with_a_list_of_indices_reads_them_in_order_with_repeats():
    ds = dl.MapDataset.range(10).map(lambda x: x * 10).slice([3, 1, 4, 1, 5])
    assert len(ds) == 5
    assert list(ds) == [30, 10, 40, 10, 50]
    assert ds[3] == 10


def test_slice_with_a_range_or_a_map_dataset_of_indices():
    ds = dl.MapDataset.range(100)
    assert list(ds.slice(range(90, 99, 4))) == [90, 94, 98]
    assert list(ds.slice(dl.MapDataset.range(3).map(lambda i: 2 * i))) == [0, 2, 4]
    assert len(ds.slice(range(10**12))) == 10**12  # a range is computed, never stored


def test_reindexed_dataset_reads_the_parents_next_epoch_past_its_length():
    shuffled = dl.MapDataset.range(6).seed(5).shuffle()
    ds = shuffled.slice([2, 0])
    # pass e reads index + e * len(parent): a shuffle's next epoch is a new order
    assert [ds[i] for i in range(4)] == [shuffled[2], shuffled[0], shuffled[8], shuffled[6]]


def test_slicing_a_reindexed_dataset_and_an_empty_index_list():
    ds = dl.MapDataset.range(10).slice([9, 8, 7, 6])
    assert list(ds[1:3]) == [8, 7]
    empty = dl.MapDataset.range(10).slice([])
    assert len(empty) == 0 and list(empty) == []


def test_reindexed_stream_restores_from_its_state():
    ds = dl.MapDataset.range(10).slice([5, 3, 5, 0, 9]).to_iter_dataset()
    it = iter(ds)
    assert [next(it), next(it)] == [5, 3]
    again = iter(ds)
    again.set_state(it.get_state())
    assert list(again) == [5, 0, 9]


def test_a_state_of_other_indices_is_refused():
    it = iter(dl.MapDataset.range(10).slice([1, 2, 3]).to_iter_dataset())
    next(it)
    other = iter(dl.MapDataset.range(10).slice([3, 2, 1]).to_iter_dataset())
    with pytest.raises(dl.StateMismatchError):
        other.set_state(it.get_state())


@pytest.mark.parametrize(("indices", "error", "match"), [
    ([1, -1], ValueError, r"index 1 is -1"),
    (range(-2, 3), ValueError, r"negative indices"),
    ([1, 2.5], TypeError, r"index 1 is 2.5"),
    ("abc", TypeError, r"slice\(\) takes a slice or a sequence"),
    (dl.MapDataset.range(3).repeat(), ValueError, r"is infinite"),
])
def test_bad_index_sequences_are_refused_with_the_value(indices, error, match):
    with pytest.raises(error, match=match):
        dl.MapDataset.range(10).slice(indices)


def test_indexing_with_a_list_points_to_slice():
    with pytest.raises(TypeError, match=r"use ds.slice\(\[\.\.\.\]\)"):
        dl.MapDataset.range(10)[[1, 2]]


# -- seeds ---------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [2**32, 893247023984, 2**64 + 7, 2**200])
def test_random_map_takes_seeds_of_any_size_and_stays_reproducible(seed):
    def draw(x, rng):
        return x + int(rng.integers(1 << 30))

    ds = dl.MapDataset.range(8).random_map(draw, seed=seed)
    first = list(ds)
    assert first == list(dl.MapDataset.range(8).random_map(draw, seed=seed))
    assert first != list(dl.MapDataset.range(8).random_map(draw, seed=seed + 1))
    stream = dl.MapDataset.range(8).to_iter_dataset().seed(seed).random_map(draw)
    assert list(stream) == list(dl.MapDataset.range(8).to_iter_dataset().seed(seed).random_map(draw))


def _draw_into(key):
    def draw(element, rng):
        return {**element, key: int(rng.integers(1 << 30))}
    return draw


@pytest.mark.parametrize("stream", [False, True])
def test_random_maps_chained_after_one_seed_draw_different_numbers(stream):
    """Grain gives each random map after ``.seed(s)`` a seed of its own (its test reads the
    private ``_seed``); here each draws from (seed, position, operation), so two chained
    maps differ from each other and each is reproducible."""
    def build():
        ds = dl.MapDataset.range(40).map(lambda x: {"x": x})
        ds = ds.to_iter_dataset().seed(129) if stream else ds.seed(129)
        return ds.random_map(_draw_into("a")).random_map(_draw_into("b"))

    out = list(build())
    assert out == list(build())
    assert [e["x"] for e in out] == list(range(40))
    assert [e["a"] for e in out] != [e["b"] for e in out]
    assert sum(e["a"] == e["b"] for e in out) <= 1


def test_seeds_below_the_key_width_keep_their_orders():
    """Folding applies only to seeds too wide for their key: smaller ones are unchanged."""
    assert list(dl.MapDataset.range(50).shuffle(seed=123)) == list(
        dl.IndexSampler(50, shuffle=True, seed=123).record_keys(np.arange(50))
    )


@pytest.mark.parametrize("seed", [2**32, 2**63, 2**100])
def test_big_seeds_shuffle_reproducibly_everywhere(seed):
    ds = dl.MapDataset.range(40)
    order = list(ds.shuffle(seed=seed))
    assert sorted(order) == list(range(40))
    assert order == list(ds.shuffle(seed=seed))
    assert sorted(ds.seed(seed).shuffle()) == list(range(40))
    window = list(ge.WindowShuffleMapDataset(ds, window_size=8, seed=seed))
    assert sorted(window) == list(range(40))
    assert list(ge.WindowShuffleIterDataset(ds.to_iter_dataset(), window_size=8, seed=seed)) == window


@pytest.mark.parametrize("seed", [-1, 1.5, True, "7"])
def test_negative_or_non_integer_seeds_are_refused(seed):
    with pytest.raises(ValueError, match=r"must be a non-negative integer, got"):
        dl.MapDataset.range(3).seed(seed)
    with pytest.raises(ValueError, match=r"must be a non-negative integer, got"):
        dl.MapDataset.range(3).random_map(lambda x, rng: x, seed=seed)


# -- next index ------------------------------------------------------------------------------


def test_thread_prefetch_tells_and_moves_to_the_next_index():
    it = iter(ge.ThreadPrefetchIterDataset(dl.MapDataset.range(20).to_iter_dataset(), prefetch_buffer_size=4))
    for i in range(6):
        assert ge.get_next_index(it) == i
        assert next(it) == i
    for i in (15, 2, 19, 0):
        ge.set_next_index(it, i)
        assert ge.get_next_index(it) == i
        assert next(it) == i


def test_thread_prefetch_next_index_after_set_state():
    ds = ge.ThreadPrefetchIterDataset(dl.MapDataset.range(20).to_iter_dataset(), prefetch_buffer_size=4)
    it = iter(ds)
    for _ in range(7):
        next(it)
    other = iter(ds)
    other.set_state(it.get_state())
    assert ge.get_next_index(other) == 7
    assert next(other) == 7


def test_interleave_of_one_dataset_has_its_next_index():
    it = iter(ge.InterleaveIterDataset([dl.MapDataset.range(10).to_iter_dataset()], cycle_length=1))
    assert ge.get_next_index(it) == 0
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    assert ge.get_next_index(it) == 3
    for i in (9, 4, 0):
        ge.set_next_index(it, i)
        assert next(it) == i


def test_interleave_of_several_datasets_refuses_next_index_as_grain_does():
    parts = [dl.MapDataset.range(3).to_iter_dataset()] * 2
    it = iter(ge.InterleaveIterDataset(parts, cycle_length=2))
    with pytest.raises(NotImplementedError, match=r"get_next_index is not supported for .*more than one"):
        ge.get_next_index(it)
    with pytest.raises(NotImplementedError, match=r"set_next_index is not supported for .*more than one"):
        ge.set_next_index(it, 0)


def test_limit_counts_its_next_index_and_moves_its_parent():
    it = iter(ge.LimitIterDataset(dl.MapDataset.range(10).to_iter_dataset(), 6))
    next(it)
    assert ge.get_next_index(it) == 1
    ge.set_next_index(it, 4)
    assert ge.get_next_index(it) == 4
    assert list(it) == [4, 5]


def test_set_next_index_refuses_a_negative_index():
    it = iter(dl.MapDataset.range(5).to_iter_dataset())
    with pytest.raises(ValueError, match=r"non-negative integer index, got -1"):
        ge.set_next_index(it, -1)


# -- ThreadPrefetchDatasetIterator by hand --------------------------------------------------


class _Counter:
    """A checkpointable iterator that is not a DatasetIterator (Grain accepts those)."""

    def __init__(self) -> None:
        self.n = 0

    def __iter__(self) -> _Counter:
        return self

    def __next__(self) -> int:
        if self.n >= 8:
            raise StopIteration
        self.n += 1
        return self.n

    def get_state(self) -> dict[str, int]:
        return {"n": self.n}

    def set_state(self, state: dict[str, int]) -> None:
        self.n = state["n"]


@pytest.mark.parametrize("size", [0, 1, 5])
def test_thread_prefetch_iterator_takes_grains_arguments_and_any_checkpointable_parent(size):
    it = ge.ThreadPrefetchDatasetIterator(_Counter(), prefetch_buffer_size=size)
    head = [next(it) for _ in range(3)]
    state = it.get_state()
    assert head + list(it) == list(range(1, 9))
    it.set_state(state)
    assert list(it) == list(range(4, 9))


def test_thread_prefetch_iterator_refuses_a_negative_buffer():
    with pytest.raises(ValueError, match=r"`prefetch_buffer_size` must be greater than or equal to 0, got -1"):
        ge.ThreadPrefetchDatasetIterator(_Counter(), prefetch_buffer_size=-1)
    with pytest.raises(ValueError, match=r"greater than or equal to 0, got -2"):
        ge.ThreadPrefetchIterDataset(dl.MapDataset.range(3).to_iter_dataset(), prefetch_buffer_size=-2)


# -- empty datasets -------------------------------------------------------------------------


@pytest.mark.parametrize("make", [
    lambda: dl.MapDataset.source([]),
    lambda: dl.MapDataset.range(0),
    lambda: dl.MapDataset.range(5)[7:],
    lambda: dl.MapDataset.range(0).repeat(),
    lambda: dl.MapDataset.range(0).repeat(4),
    lambda: dl.MapDataset.range(0).seed(1).shuffle().repeat(),
    lambda: dl.MapDataset.range(0).map(lambda x: x).batch(3),
], ids=["source", "range", "slice", "repeat", "repeat4", "shuffle", "batch"])
def test_empty_datasets_have_length_zero_and_yield_nothing(make):
    ds = make()
    assert len(ds) == 0
    assert list(ds) == []
    assert list(ds.to_iter_dataset()) == []
    with pytest.raises(IndexError):
        ds[0]


def test_repeating_an_empty_stream_stays_empty():
    assert list(ge.RepeatIterDataset(dl.MapDataset.range(0).to_iter_dataset(), num_epochs=3)) == []


def test_a_filter_that_drops_everything_yields_nothing():
    ds = dl.MapDataset.range(10).filter(lambda x: False)
    assert len(ds) == 10 and ds[3] is None
    assert list(ds) == []


# -- filter thresholds -----------------------------------------------------------------------


def test_a_filter_dropping_everything_logs_grains_warning(caplog):
    ds = dl.MapDataset.range(1000).filter(lambda x: False).to_iter_dataset()
    with caplog.at_level(logging.WARNING):
        assert list(ds) == []
    assert "skipped 100.00 % of the last seen 1000 elements" in caplog.text


def test_the_raise_threshold_is_reached_at_equality_as_in_grain():
    ds = dl.MapDataset.range(1000).to_iter_dataset().filter(lambda x: x % 10 == 0)
    strict = ge.WithOptionsIterDataset(ds, ge.DatasetOptions(filter_raise_threshold_ratio=0.9))
    with pytest.raises(ValueError, match=r"skipped 90.00 % of the last seen 1000 elements"):
        list(strict)
    relaxed = ge.WithOptionsIterDataset(ds, ge.DatasetOptions(filter_raise_threshold_ratio=0.91))
    assert len(list(relaxed)) == 100


def test_grains_default_thresholds():
    options = ge.DatasetOptions()
    assert options.get("filter_warn_threshold_ratio") == 0.9
    assert options.get("filter_raise_threshold_ratio") is None


# -- Grain's batched read ----------------------------------------------------------------------


def test_getitems_reads_several_indices_with_holes_where_filtered():
    ds = dl.MapDataset.range(10).filter(lambda x: x % 3 == 0).repeat(2)
    assert ds._getitems([0, 1, 3, 12, 13]) == [0, None, 3, None, 3]


class _Squares(dl.MapDataset):
    def __init__(self) -> None:
        super().__init__()
        self.batched_calls = 0

    def __len__(self) -> int:
        return 6

    def __getitem__(self, index):
        return index * index

    def _getitems(self, indices):
        self.batched_calls += 1
        return super()._getitems(indices)


def test_a_datasets_own_getitems_is_used_and_may_call_the_default():
    ds = _Squares()
    assert ds._getitems([2, 3]) == [4, 9]
    assert list(ds.map(lambda x: x + 1)) == [1, 2, 5, 10, 17, 26]
    assert ds.batched_calls >= 2


def test_holes_of_a_filter_below_slice_and_repeat_are_skipped_after_map_with_index():
    ds = (dl.MapDataset.range(15)[:5].filter(lambda x: x % 2 == 0).map(lambda x: x + 1)
          .slice(slice(2, 5)).repeat(3).map_with_index(lambda i, x: i + x))
    assert [ds[i] for i in range(9)] == [3, None, 7, 6, None, 10, 9, None, 13]
    assert list(ds.to_iter_dataset().filter(lambda x: x % 3 != 0)) == [7, 10, 13]
