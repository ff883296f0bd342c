"""InterleaveIterDataset: Grain's order on Grain's cases, restores at every step (with and
without threads opening datasets ahead), does not depend on workers, and leaks nothing."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

import dataloader as dl
from tests.helpers import assert_restores_everywhere, assert_streams_equal, wait_until

Interleave = dl.experimental.InterleaveIterDataset


class Items(dl.IterDataset):
    """A stream of given items (possibly none), with a state: its position."""

    def __init__(self, items: list[Any]) -> None:
        super().__init__()
        self.items = items

    def __iter__(self) -> ItemsIterator:
        return ItemsIterator(self.items)


class ItemsIterator(dl.DatasetIterator):
    opened = 0

    def __init__(self, items: list[Any]) -> None:
        super().__init__()
        ItemsIterator.opened += 1
        self.items, self.i = items, 0

    def __next__(self) -> Any:
        if self.i >= len(self.items):
            raise StopIteration
        self.i += 1
        return self.items[self.i - 1]

    def get_state(self) -> dict[str, Any]:
        return {"i": self.i}

    def set_state(self, state: dict[str, Any]) -> None:
        self.i = state["i"]


# Grain's own test cases (interleave_test.py): inputs, cycle_length, Grain's output.
GRAIN_CASES = {
    "cycle_length_1": ([[1], [2, 2], [3, 3, 3], [4, 4, 4, 4], [5, 5, 5, 5, 5]], 1,
                       [1, 2, 2, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 5]),
    "cycle_length_2": ([[1], [2, 2], [3, 3, 3], [4, 4, 4, 4], [5, 5, 5, 5, 5]], 2,
                       [1, 2, 2, 3, 3, 4, 3, 4, 4, 5, 4, 5, 5, 5, 5]),
    "cycle_length_3": ([[1], [2, 2], [3, 3, 3], [4, 4, 4, 4], [5, 5, 5, 5, 5]], 3,
                       [1, 2, 3, 2, 3, 4, 3, 4, 5, 4, 5, 4, 5, 5, 5]),
    "same_lengths": ([[1, 1, 1], [2, 2, 2], [3, 3, 3], [4, 4, 4]], 3, [1, 2, 3, 1, 2, 3, 1, 2, 3, 4, 4, 4]),
    "unsorted_lengths": ([[1, 1, 1], [2], [3, 3, 3, 3], [4, 4]], 3, [1, 2, 3, 1, 3, 1, 4, 3, 4, 3]),
    "large_cycle_length": ([[1, 1, 1], [2], [3, 3, 3, 3], [4, 4]], 10, [1, 2, 3, 4, 1, 3, 4, 1, 3, 3]),
    "with_empty_datasets": ([[1, 1, 1], [], [3, 3, 3, 3], [4, 4], []], 3, [1, 3, 1, 4, 3, 1, 4, 3, 3]),
    "five_datasets_cycle_3": ([[1, 2, 3], [4], [5, 6], [7], [8, 9]], 3, [1, 4, 5, 2, 6, 3, 7, 8, 9]),
}


def _streams(to_mix: list[list[int]]) -> list[dl.IterDataset]:
    """Engine-backed streams where Grain's test has them, our own stream for an empty one."""
    return [dl.MapDataset.source(x).to_iter_dataset() if x else Items([]) for x in to_mix]


@pytest.mark.parametrize("case", GRAIN_CASES)
def test_the_order_is_grains(case):
    to_mix, cycle_length, expected = GRAIN_CASES[case]
    assert [int(x) for x in Interleave(_streams(to_mix), cycle_length=cycle_length)] == expected


@pytest.mark.parametrize("threads", [(0, 0, 0), (1, 1, 1), (10, 10, 3)])
@pytest.mark.parametrize("case", GRAIN_CASES)
def test_it_restores_at_every_step_whatever_the_threads(case, threads):
    to_mix, cycle_length, expected = GRAIN_CASES[case]
    make, ahead, buffer = threads
    ds = Interleave(_streams(to_mix), cycle_length=cycle_length, num_make_iter_threads=make,
                    make_iter_buffer_size=ahead, iter_buffer_size=buffer)
    outputs = assert_restores_everywhere(lambda: iter(ds), limit=len(expected) + 2, fresh_iterator_every=2)
    assert [int(x) for x in outputs] == expected


def test_a_map_dataset_of_datasets_is_opened_lazily_in_its_own_order():
    names = dl.MapDataset.source(["11", "2345", "678", "9999"]).seed(42).shuffle()
    order = [names[i] for i in range(4)]
    assert sorted(order) == ["11", "2345", "678", "9999"]
    ds = Interleave(names.map(lambda name: dl.MapDataset.source(list(name))), cycle_length=2)
    eager = Interleave([dl.MapDataset.source(list(name)) for name in order], cycle_length=2)
    assert list(ds) == list(eager)
    assert sorted(ds) == sorted("1123456789999")
    assert_restores_everywhere(lambda: iter(ds), limit=20)


def test_restoring_a_running_iterator_keeps_the_datasets_it_has_open():
    ItemsIterator.opened = 0
    ds = Interleave([Items(list(range(100)))] * 5, cycle_length=5, iter_buffer_size=0)
    it = iter(ds)
    first = [next(it) for _ in range(5)]
    state = it.get_state()
    next(it)
    it.set_state(state)
    assert [next(it) for _ in range(5)] == [1] * 5 and first == [0] * 5
    assert ItemsIterator.opened == 5


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_the_output_is_the_same_for_0_1_and_2_workers():
    def pipeline(workers: int) -> dl.IterDataset:
        opts = dl.MultiprocessingOptions(num_workers=workers)
        parts = [dl.MapDataset.range(i * 100, i * 100 + 7 * (i + 1)).seed(i).shuffle().map(lambda x: x * 2)
                 .to_iter_dataset().mp_prefetch(opts) for i in range(4)]
        return Interleave(parts, cycle_length=2).batch(3).mp_prefetch(opts)

    outputs = [list(pipeline(w)) for w in (0, 1, 2)]
    assert_streams_equal(outputs[0], outputs[1])
    assert_streams_equal(outputs[0], outputs[2])
    it = iter(pipeline(2))
    [next(it) for _ in range(5)]
    state = json.loads(json.dumps(it.get_state()))
    it.close()
    resumed = iter(pipeline(0))
    resumed.set_state(state)
    assert_streams_equal(list(resumed), outputs[0][5:])


def test_under_mp_prefetch_the_order_is_the_one_without_workers():
    """Grain slices the datasets among the workers, which changes the order; we do not."""
    ds = dl.MapDataset.range(1, 6).map(lambda i: dl.MapDataset.source([i]).repeat(i).to_iter_dataset())
    plain = list(Interleave(ds, cycle_length=5))
    assert plain == [1, 2, 3, 4, 5, 2, 3, 4, 5, 3, 4, 5, 4, 5, 5]
    assert list(Interleave(ds, cycle_length=5).mp_prefetch(dl.MultiprocessingOptions(num_workers=3))) == plain


def test_close_ends_every_thread_and_closes_every_open_dataset():
    before = set(threading.enumerate())
    closed = []

    class Tracked(ItemsIterator):
        def close(self) -> None:
            closed.append(self)
            super().close()

    class TrackedItems(Items):
        def __iter__(self) -> ItemsIterator:
            return Tracked(self.items)

    ds = Interleave([TrackedItems(list(range(50))) for _ in range(6)], cycle_length=3,
                    num_make_iter_threads=2, make_iter_buffer_size=2, iter_buffer_size=2)
    it = iter(ds)
    for _ in range(10):
        next(it)
    assert set(threading.enumerate()) - before  # read-ahead and opening threads run
    it.close()
    it.close()
    assert wait_until(lambda: set(threading.enumerate()) <= before), set(threading.enumerate()) - before
    assert len(closed) == 5 and all(c._closed for c in closed)  # 3 open + 2 opened ahead
    with pytest.raises(ValueError, match="closed iterator"):
        next(it)


def test_an_iterator_dropped_unclosed_ends_its_threads():
    before = set(threading.enumerate())
    it = iter(Interleave([Items(list(range(50)))] * 4, cycle_length=2, iter_buffer_size=2))
    next(it)
    del it
    assert wait_until(lambda: set(threading.enumerate()) <= before)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, None])
def test_a_bad_cycle_length_is_named(bad):
    with pytest.raises(ValueError, match=rf"cycle_length must be a positive integer .* got {bad!r}"):
        Interleave([Items([1])], cycle_length=bad)


def test_a_cycle_over_datasets_repeated_for_ever_needs_a_cycle_length():
    files = dl.MapDataset.source(["a", "b"]).repeat()
    with pytest.raises(ValueError, match="repeated for ever, so pass a cycle_length rather than len"):
        Interleave(files.map(lambda f: Items([f])), cycle_length=len(files))
    assert list(Interleave(files.map(lambda f: Items([f])), cycle_length=2).pipe(_first, 5)) == list("ababa")


def _first(ds: dl.IterDataset, n: int) -> list[Any]:
    it = iter(ds)
    out = [next(it) for _ in range(n)]
    it.close()
    return out


def test_bad_datasets_and_buffer_sizes_are_named():
    with pytest.raises(TypeError, match=r"dataset 1 is \[2\], expected an IterDataset or a MapDataset"):
        Interleave([Items([1]), [2]], cycle_length=2)
    with pytest.raises(TypeError, match="sequence of datasets or a MapDataset of datasets"):
        Interleave("ab", cycle_length=2)
    lazy = Interleave(dl.MapDataset.source([1, 2]), cycle_length=2)
    with pytest.raises(TypeError, match=r"dataset 0 is 1, expected an IterDataset"):
        list(lazy)
    with pytest.raises(ValueError, match="iter_buffer_size must be an integer >= 0, got -1"):
        Interleave([Items([1])], cycle_length=1, iter_buffer_size=-1)


def test_a_state_of_another_interleave_is_refused():
    it = iter(Interleave([Items([1, 2])] * 3, cycle_length=3))
    next(it)
    state = it.get_state()
    other = iter(Interleave([Items([1, 2])] * 3, cycle_length=2))
    with pytest.raises(dl.StateMismatchError, match="interleave of 3 open datasets but this one keeps 2 open"):
        other.set_state(state)
    fewer = iter(Interleave([Items([1, 2])] * 2, cycle_length=3))
    with pytest.raises(dl.StateMismatchError, match=r"3 open datasets but this one keeps 2 open \(cycle_length=2 over 2"):
        fewer.set_state(state)
    with pytest.raises(dl.StateMismatchError, match="expected a state of an interleave"):
        other.set_state({"i": 3})


def test_an_empty_list_of_datasets_yields_nothing():
    assert list(Interleave([], cycle_length=4)) == []
