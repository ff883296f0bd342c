"""MapDataset.select_from_datasets: Grain's selection-map examples, epochs, restores, bad maps."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import dataloader as dl
from tests.helpers import assert_restores_everywhere


class ExplicitSelectionMap(dl.DatasetSelectionMap):
    """Grain's test map: ``length`` indices routed by a function (IndexError past the end)."""

    def __init__(self, length: int, route: Callable[[int], tuple[int, int]]) -> None:
        self._length, self._route = length, route

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int) -> tuple[int, int]:
        if index >= self._length:
            raise IndexError(f"index {index} out of range")
        return self._route(index)


SECOND_EPOCH = [1, 0, 3, 2, 4]


def interleaved(i):
    return i % 2, i // 2


def sequential(i):
    return (0 if i < 5 else 1), i % 5


def subset_and_shuffle(i):
    if i < 5:
        return i % 2, i // 2
    return SECOND_EPOCH[i - 5] % 2, SECOND_EPOCH[i - 5] // 2


def select(route, length=10):
    evens, odds = dl.MapDataset.range(0, 10, 2), dl.MapDataset.range(1, 10, 2)
    return dl.MapDataset.select_from_datasets([evens, odds], ExplicitSelectionMap(length, route))


@pytest.mark.parametrize(("route", "expected"), [
    (interleaved, list(range(10))),
    (sequential, [0, 2, 4, 6, 8, 1, 3, 5, 7, 9]),
    (subset_and_shuffle, [0, 1, 2, 3, 4, 1, 0, 3, 2, 4]),
])
def test_selection_maps_of_grains_tests(route, expected):
    ds = select(route)
    assert len(ds) == 10
    assert [ds[i] for i in range(10)] == expected
    assert list(ds) == expected


def test_a_repeated_selection_moves_each_component_to_its_next_epoch():
    a = dl.MapDataset.range(4).seed(1).shuffle()
    b = dl.MapDataset.range(10, 14)
    ds = dl.MapDataset.select_from_datasets([a, b], ExplicitSelectionMap(8, interleaved)).repeat(2)
    out = list(ds)
    first, second = out[:8], out[8:]
    assert first[0::2] == list(a) and second[0::2] == list(a.repeat()[4:8])  # a's second shuffle
    assert second[0::2] != first[0::2]
    assert first[1::2] == second[1::2] == [10, 11, 12, 13]
    assert sorted(second[0::2]) == [0, 1, 2, 3]


def test_a_selection_is_a_map_dataset_that_restores_at_every_step():
    ds = select(subset_and_shuffle).seed(2).shuffle().repeat(3).map(lambda x: x * 3).to_iter_dataset().batch(4)
    assert_restores_everywhere(lambda: iter(ds), limit=12)


def test_any_object_with_len_and_getitem_is_a_selection_map():
    ds = dl.MapDataset.select_from_datasets([dl.MapDataset.range(3), dl.MapDataset.range(5, 8)],
                                            [(1, 2), (0, 0), (1, 0)])
    assert list(ds) == [7, 0, 5]


def test_batched_components_are_selected_as_batches():
    ds = dl.MapDataset.select_from_datasets([dl.MapDataset.range(6).batch(2), dl.MapDataset.range(6, 8).batch(2)],
                                            [(1, 0), (0, 2), (0, 0)])
    assert [b.tolist() for b in ds] == [[6, 7], [4, 5], [0, 1]]


def test_bad_selection_maps_are_refused_with_the_entry_named():
    parts = [dl.MapDataset.range(3), dl.MapDataset.range(3)]
    with pytest.raises(ValueError, match=r"selection_map\[1\] is \(2, 0\); the dataset index must be in \[0, 2\)"):
        dl.MapDataset.select_from_datasets(parts, [(0, 0), (2, 0)])
    with pytest.raises(ValueError, match=r"selection_map\[0\] is 'x'; it must be a pair"):
        dl.MapDataset.select_from_datasets(parts, ["x"])
    with pytest.raises(ValueError, match=r"selection_map\[0\] is \(0, -1\); .* index within it >= 0"):
        dl.MapDataset.select_from_datasets(parts, [(0, -1)])
    with pytest.raises(ValueError, match=r"selection map of length 0; it must select at least one"):
        dl.MapDataset.select_from_datasets(parts, [])
    with pytest.raises(TypeError, match=r"needs a selection map with __len__ and __getitem__ .* got 7"):
        dl.MapDataset.select_from_datasets(parts, 7)
    with pytest.raises(TypeError, match=r"select_from_datasets: datasets\[1\] is 3, expected a MapDataset"):
        dl.MapDataset.select_from_datasets([parts[0], 3], [(0, 0)])


def test_a_late_bad_entry_is_named_when_it_is_read():
    route = [(0, 0)] * 20 + [(5, 0)]
    ds = dl.MapDataset.select_from_datasets([dl.MapDataset.range(3)], route)
    with pytest.raises(ValueError, match=r"selection_map\[20\] is \(5, 0\)"):
        list(ds.to_iter_dataset())


def test_a_state_of_another_selection_is_refused():
    it = iter(select(interleaved).to_iter_dataset())
    next(it)
    other = iter(select(sequential).to_iter_dataset())
    with pytest.raises(dl.StateMismatchError, match="index_map"):
        other.set_state(it.get_state())
