"""Tests for RangeDataSource and InMemoryDataSource."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from dataloader.sources import InMemoryDataSource, RangeDataSource


def test_range_source_has_range_semantics():
    for args in [(7,), (2, 9), (10, 0, -3), (5, 5)]:
        source = RangeDataSource(*args)
        expected = range(*args)
        assert len(source) == len(expected)
        assert [source[i] for i in range(len(source))] == list(expected)


def test_range_source_elements_are_python_ints():
    source = RangeDataSource(3, 30, 3)
    assert type(source[np.int64(2)]) is int
    assert all(type(x) is int for x in source.__getitems__(np.array([1, 0])))


def test_range_source_getitems_keeps_order_and_duplicates():
    assert RangeDataSource(10, 20, 2).__getitems__([4, 0, 4, 1]) == [18, 10, 18, 12]


def test_range_source_handles_values_beyond_int64():
    source = RangeDataSource(2**70, 2**70 + 10)
    assert source.__getitems__([9]) == [2**70 + 9]


def test_range_source_rejects_zero_step():
    with pytest.raises(ValueError, match="step must not be zero"):
        RangeDataSource(0, 10, 0)


def test_range_source_rejects_non_integer_bounds():
    with pytest.raises(TypeError, match=r"stop must be an integer, got float 2\.5"):
        RangeDataSource(0, 2.5)


def test_range_source_repr_is_stable_and_pickles():
    source = RangeDataSource(1, 8, 2)
    assert repr(source) == "RangeDataSource(start=1, stop=8, step=2)"
    assert pickle.loads(pickle.dumps(source)) == source


def test_range_source_index_out_of_range_names_index_and_length():
    with pytest.raises(IndexError, match=r"index 5 is out of range for a source of length 5"):
        RangeDataSource(5)[5]


def test_range_source_rejects_negative_index():
    with pytest.raises(IndexError, match=r"index -1 is out of range"):
        RangeDataSource(5)[-1]


def test_in_memory_source_reads_elements_by_position():
    source = InMemoryDataSource(["a", "b", "c"])
    assert len(source) == 3
    assert source[np.int32(1)] == "b"


def test_in_memory_source_getitems_keeps_order_and_duplicates():
    source = InMemoryDataSource(["a", "b", "c"])
    assert source.__getitems__(np.array([2, 0, 2], dtype=np.int64)) == ["c", "a", "c"]


def test_in_memory_source_getitems_of_empty_indices_is_empty():
    assert InMemoryDataSource([1, 2]).__getitems__([]) == []


def test_in_memory_source_over_numpy_array_returns_rows():
    source = InMemoryDataSource(np.arange(12).reshape(4, 3))
    np.testing.assert_array_equal(source[2], [6, 7, 8])


def test_in_memory_source_repr_names_type_and_length_not_elements():
    source = InMemoryDataSource([f"secret{i}" for i in range(1000)])
    assert repr(source) == "InMemoryDataSource(<list of 1000 elements>)"


def test_in_memory_source_pickles():
    source = pickle.loads(pickle.dumps(InMemoryDataSource([b"x", b"y"])))
    assert source.__getitems__([1, 0]) == [b"y", b"x"]


def test_in_memory_source_rejects_mapping():
    with pytest.raises(TypeError, match=r"got a dict; pass list\(mapping.values\(\)\)"):
        InMemoryDataSource({"a": 1})


def test_in_memory_source_rejects_iterator():
    with pytest.raises(TypeError, match=r"got generator; materialise it first"):
        InMemoryDataSource(x for x in range(3))


def test_in_memory_source_index_out_of_range_names_index_and_length():
    with pytest.raises(IndexError, match=r"index 3 is out of range for a source of length 3"):
        InMemoryDataSource([1, 2, 3])[3]


def test_in_memory_source_getitems_out_of_range_names_first_bad_index():
    with pytest.raises(IndexError, match=r"index 7 is out of range for a source of length 3"):
        InMemoryDataSource([1, 2, 3]).__getitems__([0, 7, 9])
