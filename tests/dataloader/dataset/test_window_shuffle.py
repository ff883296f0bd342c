"""Window shuffles: each window a permutation of the parent's, new per window and epoch,
O(1) random access on the engine for the MapDataset, one window re-read on a restore for
the IterDataset, and the same order from both on one pass."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import dataloader as dl
from tests.helpers import assert_restores_everywhere, assert_streams_equal

WindowMap = dl.experimental.WindowShuffleMapDataset
WindowIter = dl.experimental.WindowShuffleIterDataset


def _windows(values: list[int], size: int) -> list[list[int]]:
    return [values[i:i + size] for i in range(0, len(values), size)]


def test_grains_map_cases_each_window_holds_its_own_elements():
    ds = WindowMap(dl.MapDataset.range(400), window_size=10, seed=42)
    assert len(ds) == 400
    values = [ds[i] for i in range(400)]
    for w, window in enumerate(_windows(values, 10)):
        assert sorted(window) == list(range(w * 10, w * 10 + 10))
    assert values != list(range(400))
    assert list(ds) == values and ds.__getitems__(range(400)) == values


def test_every_window_and_every_epoch_has_its_own_permutation():
    ds = WindowMap(dl.MapDataset.range(40), window_size=8, seed=3).repeat(3)
    values = list(ds)
    orders = [[v % 8 for v in window] for window in _windows(values, 8)]
    assert len({tuple(o) for o in orders}) == len(orders) == 15
    epochs = _windows(values, 40)
    assert all(sorted(e) == list(range(40)) for e in epochs) and epochs[0] != epochs[1] != epochs[2]


def test_a_last_short_window_keeps_each_epoch_a_permutation():
    """Grain's last window of 400 % 7 reaches past the end; ours is the remainder."""
    ds = WindowMap(dl.MapDataset.range(10), window_size=4, seed=1)
    values = list(ds)
    assert [sorted(w) for w in _windows(values, 4)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    again = list(ds.repeat(2))
    assert again[:10] == values and sorted(again[10:]) == list(range(10))


def test_the_order_is_a_pure_function_of_seed_and_window_size():
    make = lambda seed, size: list(WindowMap(dl.MapDataset.range(64), window_size=size, seed=seed))  # noqa: E731
    assert make(5, 16) == make(5, 16)
    assert make(5, 16) != make(6, 16)
    assert make(5, 16) != make(5, 8)
    assert list(WindowMap(dl.MapDataset.range(9), window_size=100, seed=2)) == list(
        WindowMap(dl.MapDataset.range(9), window_size=9, seed=2))


def test_random_access_is_o1_and_needs_no_window_in_memory():
    ds = WindowMap(dl.MapDataset.range(10**12), window_size=10**6, seed=7)
    i = 10**12 - 3
    assert (i // 10**6) * 10**6 <= ds[i] < (i // 10**6 + 1) * 10**6


def test_it_compiles_onto_the_engine_and_windows_batches_or_mixtures_alike():
    ds = WindowMap(dl.MapDataset.range(50).map(lambda x: x * 10), window_size=6, seed=4).batch(5)
    sampler = ds._compiled.sampler
    assert "window_shuffle" in sampler.index_map_signature
    batches = [b.tolist() for b in ds]
    assert sorted(x for b in batches for x in b) == list(range(0, 500, 10))
    batched = WindowMap(dl.MapDataset.range(12).batch(3), window_size=2, seed=0)
    assert sorted(map(tuple, (b.tolist() for b in batched))) == [(0, 1, 2), (3, 4, 5), (6, 7, 8), (9, 10, 11)]


def _engine_pipeline(workers: int) -> dl.IterDataset:
    base = WindowMap(dl.MapDataset.range(90).seed(2).shuffle(), window_size=16, seed=11)
    return (base.repeat(2).map(lambda x: {"x": np.full(2, x)}).to_iter_dataset()
            .filter(lambda e: e["x"][0] % 7 != 0).batch(4)
            .mp_prefetch(dl.MultiprocessingOptions(num_workers=workers)))


def test_the_map_version_restores_at_every_step():
    assert_restores_everywhere(lambda: iter(_engine_pipeline(0)), limit=50, fresh_iterator_every=3)


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_the_map_version_is_the_same_for_0_1_and_2_workers():
    outputs = [list(_engine_pipeline(w)) for w in (0, 1, 2)]
    assert_streams_equal(outputs[0], outputs[1])
    assert_streams_equal(outputs[0], outputs[2])


def test_grains_iter_cases_windows_are_shuffled_and_differ():
    ds = WindowIter(dl.MapDataset.range(30).to_iter_dataset(), window_size=10, seed=42)
    values = list(ds)
    assert values != list(range(30)) and sorted(values) == list(range(30))
    repeated = WindowIter(dl.MapDataset.range(8).repeat(3).to_iter_dataset(), window_size=8, seed=42)
    first, second, third = _windows(list(repeated), 8)
    assert first != second != third != first
    assert sorted(first) == sorted(second) == sorted(third) == list(range(8))


def test_on_one_pass_the_iter_and_map_versions_agree():
    for n, size in [(10, 4), (64, 8), (5, 9), (1, 1)]:
        stream = WindowIter(dl.MapDataset.range(n).to_iter_dataset(), window_size=size, seed=9)
        assert list(stream) == list(WindowMap(dl.MapDataset.range(n), window_size=size, seed=9))


class Counting(dl.IterDataset):
    """0, 1, 2, ... ``count`` of them, counting the elements its iterators produce."""

    produced = 0

    def __init__(self, count: int) -> None:
        super().__init__()
        self.count = count

    def __iter__(self) -> CountingIterator:
        return CountingIterator(self.count)


class CountingIterator(dl.DatasetIterator):
    def __init__(self, count: int) -> None:
        super().__init__()
        self.i, self.count = 0, count

    def __next__(self) -> int:
        if self.i >= self.count:
            raise StopIteration
        self.i += 1
        Counting.produced += 1
        return self.i - 1

    def get_state(self) -> dict[str, Any]:
        return {"i": self.i}

    def set_state(self, state: dict[str, Any]) -> None:
        self.i = state["i"]


def test_the_iter_version_restores_at_every_step_by_reading_one_window():
    ds = WindowIter(Counting(1000), window_size=16, seed=5)
    assert_restores_everywhere(lambda: iter(ds), limit=40, fresh_iterator_every=2)
    it = iter(ds)
    for _ in range(900):
        next(it)
    state = it.get_state()
    assert state["pos_in_window"] == 900 % 16 and state["window_index"] == 900 // 16
    Counting.produced = 0
    restored = iter(ds)
    restored.set_state(state)
    assert next(restored) == next(it)
    assert Counting.produced == 16  # the one window, not the 900 elements before it


def test_between_windows_the_state_points_at_the_next_window():
    it = iter(WindowIter(Counting(10), window_size=5, seed=0))
    [next(it) for _ in range(5)]
    assert it.get_state() == {"parent": {"i": 5}, "window_index": 1, "pos_in_window": 0,
                              "window_size": 5, "seed": 0}


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_the_iter_version_over_an_engine_stream_is_the_same_for_0_1_and_2_workers():
    def pipeline(workers: int) -> dl.IterDataset:
        base = dl.MapDataset.range(120).seed(1).shuffle().map(lambda x: x * 3).to_iter_dataset()
        return WindowIter(base.filter(lambda x: x % 5 != 0), window_size=7, seed=3).batch(4).mp_prefetch(
            dl.MultiprocessingOptions(num_workers=workers))

    outputs = [list(pipeline(w)) for w in (0, 1, 2)]
    assert_streams_equal(outputs[0], outputs[1])
    assert_streams_equal(outputs[0], outputs[2])
    assert_restores_everywhere(lambda: iter(pipeline(2)), limit=12, fresh_iterator_every=4)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_a_bad_window_size_is_named(bad):
    with pytest.raises(ValueError, match=rf"window_size must be a positive integer, got {bad!r}"):
        WindowMap(dl.MapDataset.range(4), window_size=bad, seed=0)
    with pytest.raises(ValueError, match=rf"window_size must be a positive integer, got {bad!r}"):
        WindowIter(Counting(4), window_size=bad, seed=0)


def test_bad_seeds_and_parents_are_named():
    with pytest.raises(ValueError, match=r"seed must be a non-negative integer, got -1"):
        WindowMap(dl.MapDataset.range(4), window_size=2, seed=-1)
    with pytest.raises(ValueError, match=r"seed must be a non-negative integer, got None"):
        WindowIter(Counting(4), window_size=2, seed=None)
    with pytest.raises(TypeError, match="WindowShuffleMapDataset shuffles a MapDataset"):
        WindowMap(Counting(4), window_size=2, seed=0)
    with pytest.raises(TypeError, match=r"reads an IterDataset.*WindowShuffleMapDataset shuffles a MapDataset"):
        WindowIter(dl.MapDataset.range(4), window_size=2, seed=0)


def test_a_state_of_another_window_shuffle_is_refused():
    it = iter(WindowIter(Counting(20), window_size=4, seed=1))
    next(it)
    state = it.get_state()
    with pytest.raises(dl.StateMismatchError, match="window_size=4 and seed=1 but this one has window_size=5"):
        iter(WindowIter(Counting(20), window_size=5, seed=1)).set_state(state)
    with pytest.raises(dl.StateMismatchError, match="expected a state of a window shuffle"):
        it.set_state({"i": 2})
