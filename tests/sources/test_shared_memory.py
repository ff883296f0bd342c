"""SharedMemoryDataSource: records stored once in shared memory, read as views."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

from dataloader.sources import InMemoryDataSource, SharedMemoryDataSource


def _blocks() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if "_src_" in n}


@pytest.mark.parametrize(("elements", "index", "expected"), [
    (np.arange(12).reshape(4, 3), 2, [6, 7, 8]),
    ({"x": np.arange(4), "y": np.arange(8).reshape(4, 2)}, 1, {"x": 1, "y": [2, 3]}),
    ([b"ab", b"", b"cde"], 2, b"cde"),
    (["héllo", "x"], 0, "héllo"),
    ([np.zeros((1, 2)), np.full((2, 2), 7.0), np.zeros((3, 2))], 1, [[7.0, 7.0], [7.0, 7.0]]),
])
def test_records_read_back_here_and_after_pickling(elements, index, expected):
    source = SharedMemoryDataSource(elements)
    for s in (source, pickle.loads(pickle.dumps(source))):
        got = s[index]
        if isinstance(got, dict):
            got = {k: v.tolist() for k, v in got.items()}
        elif isinstance(got, np.ndarray):
            got = got.tolist()
        assert got == expected
    assert len(source) == (4 if not isinstance(elements, list) else len(elements))


def test_pickling_sends_the_name_not_the_data_and_arrays_are_read_only_views():
    source = SharedMemoryDataSource(np.ones((1000, 1000), np.float32))
    data = pickle.dumps(source)
    assert len(data) < 1000
    record = pickle.loads(data)[3]
    assert not record.flags.writeable and record.base is not None


def test_the_block_is_unlinked_with_the_source():
    before = _blocks()
    source = SharedMemoryDataSource(np.arange(10))
    assert len(_blocks() - before) == 1
    del source
    import gc

    gc.collect()
    assert _blocks() == before


def test_a_source_whose_block_is_gone_says_so_when_unpickled():
    source = SharedMemoryDataSource(np.arange(10))
    data = pickle.dumps(source)
    del source
    import gc

    gc.collect()
    with pytest.raises(FileNotFoundError, match=r"shared-memory block .* is gone: .*keep the source alive"):
        pickle.loads(data)


@pytest.mark.parametrize(("elements", "error", "match"), [
    ([{"a": 1}], TypeError, r"records of type dict cannot be shared without a copy per process"),
    ([], ValueError, r"got no records"),
    ({"a": np.arange(3), "b": np.arange(4)}, ValueError, r"arrays of one length"),
    (np.array(5), TypeError, r"needs an array of records along axis 0"),
    ([b"a", "b"], TypeError, r"record 1 is str, record 0 is bytes"),
])
def test_what_cannot_be_shared_is_refused_with_a_reason(elements, error, match):
    with pytest.raises(error, match=match):
        SharedMemoryDataSource(elements)


def test_an_in_memory_source_sends_a_large_array_through_shared_memory_once():
    array = np.arange(2_000_000, dtype=np.int64).reshape(1000, 2000)
    source = InMemoryDataSource(array)
    first, second = pickle.dumps(source), pickle.dumps(source)
    assert len(first) < 2000 and first == second  # one block, made on the first pickling
    copy = pickle.loads(first)
    assert (copy[7] == array[7]).all() and len(copy) == 1000
    small = InMemoryDataSource([1, 2, 3])
    assert pickle.loads(pickle.dumps(small))[2] == 3
