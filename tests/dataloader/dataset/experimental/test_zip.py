"""ZipMapDataset and ZipIterDataset: tuples, Grain's strictness, restores, bad input."""

from __future__ import annotations

import numpy as np
import pytest

import dataloader as dl
from dataloader.experimental import ZipIterDataset, ZipMapDataset
from tests.dataloader.dataset.experimental.streams import Counted, engine_stream
from tests.helpers import assert_restores_everywhere


def test_zip_map_dataset_pairs_elements_at_the_same_index():
    a = dl.MapDataset.range(5)
    b = dl.MapDataset.range(10, 15).map(lambda x: -x)
    zipped = ZipMapDataset([a, b])
    assert len(zipped) == 5
    assert zipped[3] == (3, -13)
    assert list(zipped) == [(i, -10 - i) for i in range(5)]
    assert isinstance(zipped, dl.MapDataset)


def test_zip_map_dataset_reads_each_parent_with_its_own_chain():
    a = dl.MapDataset.range(6).seed(1).shuffle()
    b = dl.MapDataset.range(6).seed(1).shuffle().map(lambda x: x * 10)
    assert all(y == 10 * x for x, y in ZipMapDataset([a, b]))
    assert [x for x, _ in ZipMapDataset([a, b])] == list(a)


def test_shuffling_and_batching_a_zip_keeps_the_pairs_together():
    zipped = ZipMapDataset([dl.MapDataset.range(8), dl.MapDataset.range(100, 108)])
    shuffled = list(zipped.seed(4).shuffle())
    assert sorted(shuffled) == list(zipped) and shuffled != list(zipped)
    batches = list(zipped.batch(3))
    assert [b[0].tolist() for b in batches] == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert [b[1].tolist() for b in batches] == [[100, 101, 102], [103, 104, 105], [106, 107]]


def test_a_zip_over_a_filtered_parent_keeps_its_holes_and_refuses_a_batch():
    odd = dl.MapDataset.range(4).filter(lambda x: x % 2 == 1)
    zipped = ZipMapDataset([odd, dl.MapDataset.range(4)])
    with pytest.raises(ValueError, match=r"Batch\(2, drop_remainder=False\) after a filter or a flat map is not available"):
        zipped.batch(2)
    assert [zipped[i] for i in range(4)] == [(None, 0), (1, 1), (None, 2), (3, 3)]  # holes read as None


def test_zip_map_dataset_streams_and_restores_at_every_step():
    zipped = ZipMapDataset([dl.MapDataset.range(20).seed(3).shuffle(), dl.MapDataset.range(20).map(lambda x: x * x)])
    assert_restores_everywhere(lambda: iter(zipped.repeat(2).to_iter_dataset().batch(3)), limit=20)


def test_zip_map_dataset_refuses_parents_of_different_lengths():
    with pytest.raises(ValueError, match=r"parents of one length, got lengths \[3, 4\]"):
        ZipMapDataset([dl.MapDataset.range(3), dl.MapDataset.range(4)])


def test_zip_map_dataset_refuses_infinite_parents_empty_lists_and_other_types():
    with pytest.raises(ValueError, match=r"parents\[1\] .* is infinite; zip finite datasets and repeat\(\) the zip"):
        ZipMapDataset([dl.MapDataset.range(3), dl.MapDataset.range(3).repeat()])
    with pytest.raises(ValueError, match="at least one parent"):
        ZipMapDataset([])
    with pytest.raises(TypeError, match=r"parents\[0\] is \[1, 2\], expected a MapDataset"):
        ZipMapDataset([[1, 2]])


def test_zip_iter_dataset_pulls_one_element_from_each_stream():
    ds = ZipIterDataset([Counted([1, 2, 3]), dl.MapDataset.range(3).to_iter_dataset()])
    assert list(ds) == [(1, 0), (2, 1), (3, 2)]


def test_zip_iter_dataset_accepts_map_datasets_as_grain_does():
    assert list(ZipIterDataset([dl.MapDataset.range(2), dl.MapDataset.range(5, 7)])) == [(0, 5), (1, 6)]


def test_strict_zip_raises_when_a_later_stream_is_shorter():
    ds = ZipIterDataset([Counted([1, 2, 3]), Counted([1, 2]), Counted([1, 2, 3])])
    with pytest.raises(ValueError, match=r"argument 2 is shorter than argument 1; pass strict=False"):
        list(ds)
    ds = ZipIterDataset([Counted([1, 2]), Counted([1, 2]), Counted([1])])
    with pytest.raises(ValueError, match=r"argument 3 is shorter than arguments 1-2"):
        list(ds)


def test_strict_zip_raises_when_a_later_stream_is_longer():
    with pytest.raises(ValueError, match=r"argument 2 is longer than argument 1"):
        list(ZipIterDataset([Counted([1]), Counted([1, 2])]))


def test_zip_with_strict_false_stops_at_the_shortest():
    assert list(ZipIterDataset([Counted([1, 2, 3]), Counted([4])], strict=False)) == [(1, 4)]


def test_zip_iter_dataset_restores_at_every_step():
    ds = ZipIterDataset([engine_stream(40), Counted(list(range(100))), engine_stream(40, seed=9).batch(1)], strict=False)
    outputs = assert_restores_everywhere(lambda: iter(ds), limit=50)
    assert len(outputs) == len(list(engine_stream(40)))
    assert isinstance(outputs[0][2]["x"], np.ndarray)


def test_zip_iter_dataset_checks_its_arguments_and_states():
    with pytest.raises(TypeError, match=r"ZipIterDataset strict must be True or False, got 'yes'"):
        ZipIterDataset([Counted([1])], strict="yes")
    with pytest.raises(ValueError, match="at least one parent"):
        ZipIterDataset([])
    it = iter(ZipIterDataset([Counted([1]), Counted([2])]))
    with pytest.raises(dl.StateMismatchError, match=r"holds 1 parent states but the zip has 2 parents"):
        it.set_state({"parents": [{"i": 0}]})
