"""Tests for RangeDataSource and InMemoryDataSource."""

from __future__ import annotations

import errno
import gc
import os
import pickle
import stat
import weakref

import numpy as np
import pytest

from dataloader.sources import InMemoryDataSource, RangeDataSource
from tests.helpers import memfds


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


def _held_blocks() -> dict[int, str]:
    """This process's descriptors of in-memory sources' blocks."""
    return memfds("/memfd:granary-in-memory")


def _large(rows: int = 300) -> np.ndarray:
    return np.arange(rows * 1000, dtype=np.int64).reshape(rows, 1000)  # 2.4 MB: shared


def test_a_large_array_is_copied_once_into_private_memory_without_a_name_and_let_go():
    """Pickling (what a loader with workers does) moves the array into a memfd: the
    source reads that from then on, so an array handed over is held once, not twice."""
    before = set(_held_blocks())
    array = _large()
    expected = array.copy()
    given = weakref.ref(array)
    source = InMemoryDataSource(array)
    del array
    assert given() is not None  # worker_count=0: nothing copied, the array is read as given
    first, second = pickle.dumps(source), pickle.dumps(source)
    gc.collect()
    assert given() is None, "the source still holds the array it copied"
    assert first == second and len(first) < 1000  # one block, made on the first pickling
    made = set(_held_blocks()) - before  # the source's descriptor (and its mapping's)
    assert made and {stat.S_IMODE(os.fstat(fd).st_mode) for fd in made} == {0o600}  # no other user's
    assert not any(n.startswith("granary_") for n in os.listdir("/dev/shm"))
    copy = pickle.loads(first)
    for reader in (source, copy):
        np.testing.assert_array_equal(reader.__getitems__([299, 0])[0], expected[299])
        assert len(reader) == 300 and not reader[5].flags.writeable
    assert pickle.loads(pickle.dumps(copy))[7].tolist() == expected[7].tolist()  # re-sent by a copy
    copy.close()
    source.close()
    assert set(_held_blocks()) <= before


def test_an_array_the_caller_keeps_is_not_changed_by_the_source_nor_changes_it():
    array = _large()
    source = InMemoryDataSource(array)
    pickle.dumps(source)
    array[3] = -1  # the caller's array and the shared copy are two arrays
    assert source[3][0] == 3000 and pickle.loads(pickle.dumps(source))[3][0] == 3000
    source.close()


def test_small_arrays_and_arrays_of_objects_or_subclasses_are_pickled_as_they_are():
    masked = np.ma.masked_array(_large(), mask=False)
    for elements in (np.arange(10), np.array([{"a": 1}] * 200_000, dtype=object), masked):
        source = InMemoryDataSource(elements)
        copy = pickle.loads(pickle.dumps(source))
        assert source.elements is elements and type(copy.elements) is type(elements)


def test_close_frees_a_shared_array_and_reading_it_afterwards_says_so():
    source = InMemoryDataSource(_large())
    sent = pickle.dumps(source)
    early = pickle.loads(sent)
    source.close()
    with pytest.raises(ValueError, match=r"InMemoryDataSource was closed: close\(\) freed the shared memory"):
        source[7]
    assert len(source) == 300
    assert early[7][0] == 7000  # a process that mapped it reads on
    with pytest.raises(OSError, match=r"cannot be read at /proc/\d+/fd/\d+ .*keep the source open while workers read it"):
        pickle.loads(sent)
    early.close()


def test_a_descriptor_number_reused_after_close_is_not_taken_for_the_block():
    before = set(_held_blocks())
    source = InMemoryDataSource(_large())
    sent = pickle.dumps(source)
    numbers = set(_held_blocks()) - before  # the one the pickle names among them
    source.close()
    gc.collect()
    assert not numbers & set(_held_blocks())
    other = os.memfd_create("not-a-block")
    try:
        os.ftruncate(other, 64 + 300 * 1000 * 8)  # the very size, not the block
        for fd in numbers:
            os.dup2(other, fd)
        with pytest.raises(OSError, match=r"that descriptor is another file now \(the source was closed\)"):
            pickle.loads(sent)
    finally:
        for fd in {*numbers, other}:  # other may have taken one of the numbers itself
            os.close(fd)


def test_without_memfd_a_large_array_is_shared_through_a_named_dev_shm_block(monkeypatch):
    def refused(name, flags=0):
        raise OSError(errno.ENOSYS, "Function not implemented")  # an old kernel, or seccomp

    monkeypatch.setattr(os, "memfd_create", refused)
    source = InMemoryDataSource(_large())
    copy = pickle.loads(pickle.dumps(source))
    blocks = [n for n in os.listdir("/dev/shm") if n.startswith(f"granary_{os.getpid()}_src_")]
    assert len(blocks) == 1 and copy[299][999] == 299_999
    copy.close()
    source.close()
    assert not os.path.exists(f"/dev/shm/{blocks[0]}")


def test_memory_that_runs_out_while_sharing_is_an_error_naming_the_size(monkeypatch):
    def no_room(fd, offset, size):
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    before = set(_held_blocks())
    monkeypatch.setattr(os, "posix_fallocate", no_room)
    source = InMemoryDataSource(_large())
    with pytest.raises(OSError, match=r"no memory left to hold an array of shape \(300, 1000\) and dtype int64 "
                       r"\(2\.3 MiB\) once for the worker processes \(\d+ MiB available .*read the records from files"):
        pickle.dumps(source)
    assert set(_held_blocks()) == before  # nothing left open
    assert source[3][0] == 3000  # still reads the array it was given


def test_in_memory_source_needs_elements_or_a_name():
    with pytest.raises(TypeError, match=r"needs elements, a sequence of records; pass InMemoryDataSource\(\[\.\.\.\]\), or name="):
        InMemoryDataSource()
