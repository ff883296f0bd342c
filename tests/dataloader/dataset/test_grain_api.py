"""Grain's smaller API pieces: apply, options and filter thresholds, element specs,
next indices, start_prefetch, and the names of grain.experimental."""

from __future__ import annotations

import logging
import re

import numpy as np
import pytest

import dataloader as dl
import dataloader.experimental as ge
from tests.helpers import wait_until


def test_apply_builds_the_chain_a_list_of_operations_describes():
    ops = [dl.MapTransform(lambda x: x + 1), dl.FilterTransform(lambda x: x % 2 == 0), dl.Batch(2)]
    chained = dl.MapDataset.range(10).to_iter_dataset().apply(ops)
    assert [b.tolist() for b in chained] == [[2, 4], [6, 8], [10]]
    assert [b.tolist() for b in dl.MapDataset.range(6).apply(dl.Batch(3))] == [[0, 1, 2], [3, 4, 5]]
    assert ge.apply_transformations(dl.MapDataset.range(3), dl.MapTransform(str))[2] == "2"


def test_apply_refuses_what_is_not_an_operation():
    with pytest.raises(TypeError, match=r"transformations\[1\] is 'x', which is not an operation"):
        dl.MapDataset.range(3).to_iter_dataset().apply([dl.MapTransform(str), "x"])


class _Double(dl.MapTransform):
    def map(self, element):
        return 2 * element


def test_an_operation_class_is_refused_where_an_operation_is_expected():
    with pytest.raises(TypeError, match=r"transformations\[0\] is the class Batch, not an operation; pass an instance, Batch\(batch_size=\.\.\.\)"):
        dl.MapDataset.range(3).apply([dl.Batch])
    with pytest.raises(TypeError, match=r"map\(\)'s argument is the class _Double, not an operation; pass an instance, _Double\(\)"):
        dl.MapDataset.range(3).map(_Double)
    with pytest.raises(TypeError, match=r"filter\(\)'s argument is the class FilterTransform, not an operation; pass an instance, FilterTransform\(your_function\)"):
        dl.MapDataset.range(3).to_iter_dataset().filter(dl.FilterTransform)
    # a class that is not an operation is a function of the element, as before
    assert list(dl.MapDataset.range(3).map(str)) == ["0", "1", "2"]
    assert list(dl.MapDataset.range(3).map(_Double())) == [0, 2, 4]


def test_pipe_applies_a_function_to_the_dataset():
    ds = dl.MapDataset.range(8).pipe(lambda d, k: d[::k], 3)
    assert list(ds) == [0, 3, 6]
    it_ds = dl.MapDataset.range(8).to_iter_dataset().pipe(ge.ThreadPrefetchIterDataset, prefetch_buffer_size=2)
    assert list(it_ds) == list(range(8))


def test_filter_thresholds_warn_by_default_and_raise_when_asked(caplog):
    ds = dl.MapDataset.range(3000).to_iter_dataset().filter(lambda x: x % 20 == 0)
    with caplog.at_level(logging.WARNING):
        assert len(list(ds)) == 150
    assert re.search(r"skipped 9\d\.\d\d % of the last seen \d+ elements.*filter_warn_threshold_ratio=0.9",
                     caplog.text)
    strict = ge.WithOptionsIterDataset(ds, ge.DatasetOptions(filter_raise_threshold_ratio=0.5))
    with pytest.raises(ValueError, match=r"at or above filter_raise_threshold_ratio=0.5"):
        list(strict)
    caplog.clear()
    quiet = ge.WithOptionsIterDataset(ds, ge.DatasetOptions(filter_warn_threshold_ratio=None))
    with caplog.at_level(logging.WARNING):
        assert len(list(quiet)) == 150
    assert "skipped" not in caplog.text


def test_options_reach_iterator_level_filters_and_outer_options_win():
    class Numbers(dl.IterDataset):
        def __iter__(self):
            return iter(dl.MapDataset.range(2000).to_iter_dataset())

    ds = ge.WithOptionsIterDataset(Numbers().filter(lambda x: x % 10 == 0),
                                   ge.DatasetOptions(filter_raise_threshold_ratio=0.99))
    assert len(list(ds)) == 200  # 90% dropped: below the inner threshold
    outer = ge.WithOptionsIterDataset(ds, ge.DatasetOptions(filter_raise_threshold_ratio=0.5))
    with pytest.raises(ValueError, match=r"skipped 90\.00 % .* at or above filter_raise_threshold_ratio=0.5"):
        list(outer)


def test_dataset_options_check_their_fields_and_merge():
    with pytest.raises(ValueError, match=r"filter_raise_threshold_ratio must be None or a ratio in \[0, 1\], got 2"):
        ge.DatasetOptions(filter_raise_threshold_ratio=2)
    merged = ge.DatasetOptions(min_shm_size=5).merge(ge.DatasetOptions(min_shm_size=7, filter_warn_threshold_ratio=0.1))
    assert merged.get("min_shm_size") == 5 and merged.get("filter_warn_threshold_ratio") == 0.1
    assert ge.DatasetOptions().get("filter_warn_threshold_ratio") == 0.9


def test_element_spec_describes_leaves_by_shape_and_dtype():
    ds = dl.MapDataset.range(4).map(lambda x: {"a": np.zeros((2, 3), np.float32), "b": (x, np.int8(x))})
    spec = ge.get_element_spec(ds)
    assert spec["a"] == ge.ShapeDtypeStruct((2, 3), np.dtype(np.float32))
    assert spec["b"][1].dtype == np.int8
    assert ge.get_element_spec(ds.batch(2, drop_remainder=True).to_iter_dataset())["a"].shape == (2, 2, 3)
    with pytest.raises(ValueError, match="has no element"):
        ge.get_element_spec(dl.MapDataset.range(3)[3:])


def test_element_spec_of_a_kept_remainder_batch_has_an_unknown_leading_dimension():
    """As in Grain: batches that keep the remainder give None for the batch dimension,
    even where the length divides evenly; a dropped remainder or padding gives the size."""
    source = dl.MapDataset.range(10).map(lambda x: {"x": np.full((2,), x)})
    kept = [source.batch(5), source.to_iter_dataset().batch(5), source.batch(5).to_iter_dataset(),
            source.to_iter_dataset().filter(lambda e: True).batch(5),
            ge.LimitIterDataset(source.to_iter_dataset(), 7).batch(5)]
    for ds in kept:
        assert ge.get_element_spec(ds) == {"x": ge.ShapeDtypeStruct((None, 2), np.dtype(np.int64))}, ds
    fixed = [source.batch(3, drop_remainder=True), source.to_iter_dataset().batch(3, drop_remainder=True)]
    for ds in fixed:
        assert ge.get_element_spec(ds) == {"x": ge.ShapeDtypeStruct((3, 2), np.dtype(np.int64))}, ds
    assert ge.get_element_spec(source.batch_and_pad(4))["x"].shape == (4, 2)
    # A step after the batch reshapes as it likes: its first element is read as it is.
    assert ge.get_element_spec(source.batch(5).map(lambda b: b["x"][:1])).shape == (1, 2)


def test_next_index_of_a_plain_batched_stream_can_be_read_and_set():
    it = iter(dl.MapDataset.range(20).seed(1).shuffle().batch(4).to_iter_dataset())
    expected = list(iter(dl.MapDataset.range(20).seed(1).shuffle().batch(4).to_iter_dataset()))
    next(it)
    assert ge.get_next_index(it) == 1
    ge.set_next_index(it, 3)
    assert next(it).tolist() == expected[3].tolist()
    assert ge.get_next_index(it) == 4


def test_next_index_is_refused_where_it_needs_processing():
    it = iter(dl.MapDataset.range(10).to_iter_dataset().filter(lambda x: x > 2))
    with pytest.raises(ValueError, match=r"cannot tell the index of its next element without processing"):
        ge.get_next_index(it)
    with pytest.raises(ValueError, match=r"cannot move to element 3 without processing"):
        ge.set_next_index(it, 3)
    with pytest.raises(NotImplementedError, match=r"cannot move to element 3"):  # what Grain raises there
        ge.set_next_index(it, 3)
    with pytest.raises(NotImplementedError, match=r"cannot tell the index"):
        ge.get_next_index(it)


def test_next_index_after_an_iterator_level_map_with_index_is_the_parents():
    """``map_with_index`` on a stream is a stage of its own; one output per element, so
    its next index is its parent's, and moving it moves the index the call gets."""
    it = iter(dl.MapDataset.range(12).to_iter_dataset().map_with_index(lambda i, x: (i, x * 10)))
    for i in range(12):
        assert ge.get_next_index(it) == i
        assert next(it) == (i, i * 10)
    for i in (7, 2, 11, 0):
        ge.set_next_index(it, i)
        assert ge.get_next_index(it) == i
        assert next(it) == (i, i * 10)
    # After a filter the index counts survivors, which the stream cannot tell unread.
    filtered = iter(dl.MapDataset.range(12).to_iter_dataset().filter(lambda x: x % 2)
                    .map_with_index(lambda i, x: (i, x)))
    with pytest.raises(NotImplementedError, match=r"cannot tell the index"):
        ge.get_next_index(filtered)
    with pytest.raises(NotImplementedError, match=r"cannot move to element 3"):
        ge.set_next_index(filtered, 3)


def test_start_prefetch_reads_the_first_records_before_the_first_next():
    read = []

    class Recording:
        def __len__(self):
            return 8

        def __getitem__(self, i):
            read.append(int(i))
            return int(i)

    it = iter(dl.MapDataset.source(Recording()).batch(2).to_iter_dataset())
    it.start_prefetch()
    assert wait_until(lambda: 0 in read), "the first record is read before the first next()"
    assert [b.tolist() for b in it] == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_the_names_of_grain_experimental_are_there():
    for name in ["ThreadPrefetchIterDataset", "ThreadPrefetchDatasetIterator", "multithread_prefetch",
                 "FirstFitPackIterDataset", "BestFitPackIterDataset", "ConcatThenSplitIterDataset",
                 "BOSHandling", "FlatMapTransform", "MapWithIndexTransform", "batch_and_pad",
                 "DatasetOptions", "ExecutionTrackingMode", "WithOptionsIterDataset",
                 "apply_transformations", "get_element_spec", "get_next_index", "set_next_index"]:
        assert hasattr(ge, name), name
