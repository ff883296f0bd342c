"""A MapDataset of the user's own (Grain's way: subclass, __len__, __getitem__), chained."""

from __future__ import annotations

import pytest

import dataloader as dl
from tests.helpers import assert_restores_everywhere, assert_streams_equal


class Doubled(dl.MapDataset[int]):
    """Doubles its parent's elements; elements that are 3 mod 4 are missing (None)."""

    def __init__(self, parent: dl.MapDataset) -> None:
        super().__init__(parent)

    def __len__(self) -> int:
        return len(self._parent)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.slice(index)
        x = self._parent[index]
        return None if x % 4 == 3 else 2 * x


class Squares(dl.MapDataset):
    """A source of the user's own, with no parent."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index):
        return index * index


def test_a_users_map_dataset_is_generic_and_indexable():
    ds = Doubled(dl.MapDataset.range(8))
    assert isinstance(ds, dl.MapDataset) and ds.parents == (ds._parent,)
    assert [ds[i] for i in range(8)] == [0, 2, 4, None, 8, 10, 12, None]
    assert Squares(4)[3] == 9 and Squares(4).parents == ()


def test_iteration_skips_missing_elements_unless_nones_are_allowed():
    ds = Doubled(dl.MapDataset.range(8))
    assert list(ds) == [0, 2, 4, 8, 10, 12]
    assert list(ds.to_iter_dataset(allow_nones=True)) == [0, 2, 4, None, 8, 10, 12, None]


def test_chained_calls_on_a_users_dataset_pass_its_nones_untouched():
    ds = Doubled(dl.MapDataset.range(8)).map(lambda x: x + 1).filter(lambda x: x != 5)
    assert [ds[i] for i in range(8)] == [1, 3, None, None, 9, 11, 13, None]
    assert list(ds) == [1, 3, 9, 11, 13]


def test_index_level_calls_and_batches_on_a_users_dataset():
    ds = Squares(10).seed(4).shuffle()[:6].batch(2)
    values = [v for b in ds for v in b.tolist()]
    assert len(values) == 6 and set(values) <= {i * i for i in range(10)}
    assert_restores_everywhere(lambda: iter(Squares(30).seed(1).shuffle().to_iter_dataset().batch(4)))


def test_a_users_dataset_in_a_mixture_and_under_a_shuffle_restores_at_every_step():
    mixed = dl.MapDataset.mix([Doubled(dl.MapDataset.range(20)), Squares(10)], [0.5, 0.5])
    assert_restores_everywhere(lambda: iter(mixed.seed(2).shuffle().to_iter_dataset().batch(3)))


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_users_dataset_gives_the_same_stream_with_workers():
    def make(workers):
        return (Doubled(dl.MapDataset.range(40).seed(3).shuffle()).to_iter_dataset().batch(4)
                .mp_prefetch(dl.MultiprocessingOptions(num_workers=workers)))

    assert_streams_equal(list(make(2)), list(make(0)))


def test_map_with_index_gets_the_index_at_its_place_in_the_chain():
    ds = dl.MapDataset.range(10, 15).map_with_index(lambda i, x: (i, x))
    assert [ds[i] for i in range(5)] == [(i, 10 + i) for i in range(5)]
    before = dl.MapDataset.range(5).map_with_index(lambda i, x: (i, x)).seed(1).shuffle()
    assert all(i == x for i, x in before)  # moved by the shuffle with their index
    after = dl.MapDataset.range(5).seed(1).shuffle().map_with_index(lambda i, x: (i, x))
    assert [i for i, _ in after] == list(range(5))


def test_map_with_index_accepts_a_transform_and_refuses_a_batched_dataset():
    class Tag(dl.MapWithIndexTransform):
        def map_with_index(self, index, element):
            return f"{index}:{element}"

    assert list(dl.MapDataset.range(3).map_with_index(Tag())) == ["0:0", "1:1", "2:2"]
    with pytest.raises(ValueError, match=r"map_with_index after a batch .* map the elements before the batch"):
        dl.MapDataset.range(4).batch(2).map_with_index(Tag())
