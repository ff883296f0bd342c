"""Tests for RangeDataSource and InMemoryDataSource."""

from __future__ import annotations

import os
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


# grain.python.InMemoryDataSource is this class: Grain's arguments and methods.


def test_in_memory_source_over_python_numbers_pickles_and_reads():
    for elements in (list(range(12)), [0.5, 1.5], [True, False], [1, "a", None, {"k": 2}]):
        source = InMemoryDataSource(elements=elements)
        copy = pickle.loads(pickle.dumps(source))
        assert [copy[i] for i in range(len(copy))] == elements == list(source)


def test_in_memory_source_with_a_name_is_read_by_name_and_freed_by_close():
    name = f"gtest_{os.getpid()}_inmem"
    source = InMemoryDataSource(list(range(12)), name=name)
    assert str(source) == f"InMemoryDataSource(name={name}, len=12)"
    reader = InMemoryDataSource(name=name)
    assert reader.__getitems__([11, 0]) == [11, 0] and len(reader) == 12
    assert pickle.loads(pickle.dumps(source))[5] == 5
    source.close()
    source.unlink()  # Grain's users close, then unlink
    assert not os.path.exists(f"/dev/shm/{name}")


def test_close_frees_the_block_a_large_array_was_sent_through_and_reads_go_on():
    array = np.arange(300_000, dtype=np.int64)
    source = InMemoryDataSource(array)
    block = pickle.loads(pickle.dumps(source))._shared.name
    assert os.path.exists(f"/dev/shm/{block}")
    source.close()
    assert not os.path.exists(f"/dev/shm/{block}")
    assert source[7] == 7 and str(source) == repr(source)


def test_in_memory_source_needs_elements_or_a_name():
    with pytest.raises(TypeError, match=r"needs elements, a sequence of records; pass InMemoryDataSource\(\[\.\.\.\]\), or name="):
        InMemoryDataSource()
