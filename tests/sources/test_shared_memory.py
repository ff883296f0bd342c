"""SharedMemoryDataSource: records stored once in shared memory, read as views."""

from __future__ import annotations

import contextlib
import errno
import gc
import multiprocessing
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

from dataloader.sources import InMemoryDataSource, SharedMemoryDataSource
from tests.sources._child import read_in_child


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
    gc.collect()
    assert _blocks() == before


def test_a_source_whose_block_is_gone_says_so_when_unpickled():
    source = SharedMemoryDataSource(np.arange(10))
    data = pickle.dumps(source)
    del source
    gc.collect()
    with pytest.raises(FileNotFoundError, match=r"shared-memory block .* is gone: .*keep the source alive"):
        pickle.loads(data)


@pytest.mark.parametrize(("elements", "error", "match"), [
    ({"a": np.arange(3), "b": np.arange(4)}, ValueError, r"arrays of one length"),
    (np.array(5), TypeError, r"needs an array of records along axis 0"),
    ([np.zeros(2), np.zeros(2, np.int32)], TypeError, r"a sequence of arrays needs one dtype"),
    ([1, lambda x: x], TypeError, r"record 1 \(function\) cannot be pickled into shared memory: .*use InMemoryDataSource"),
    ("abc", TypeError, r"takes a numpy array, a dict of arrays or a sequence of records, got str"),
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


# What Grain's SharedMemoryDataSource (grain.python.InMemoryDataSource) takes.


def _shm_name(tag: str) -> str:
    return f"gtest_{os.getpid()}_{tag}_{os.urandom(3).hex()}"


def _exists(name: str) -> bool:
    return os.path.exists(os.path.join("/dev/shm", name))


@pytest.mark.parametrize("elements", [
    list(range(12)),
    [0.5, -0.0, 1e300, float("inf")],
    [True, False, True],
    [2**70, 1, -(2**80)],  # beyond int64: pickled, still exact
    [1, 2.5, True, None, "a", b"b"],  # mixed, as a ShareableList takes them
    [{"text": "a", "id": 1}, {"text": "b", "id": 2}],
    [(1, "x"), (2, "y")],
    [np.int64(3), np.float32(1.5)],
    np.array(["a", 1, None], dtype=object),
])
def test_python_objects_read_back_with_their_types_here_and_after_pickling(elements):
    expected = list(elements)
    source = SharedMemoryDataSource(elements)
    for s in (source, pickle.loads(pickle.dumps(source))):
        assert len(s) == len(expected)
        got = [s[i] for i in range(len(s))]
        assert got == expected
        assert [type(g) for g in got] == [type(e) for e in expected]
        batch = s.__getitems__(np.array([len(s) - 1, 0, 0]))
        assert batch == [expected[-1], expected[0], expected[0]]
        assert [type(b) for b in batch] == [type(expected[-1]), type(expected[0]), type(expected[0])]


def test_list_iterates_like_grains():
    assert list(SharedMemoryDataSource(list(range(5)))) == [0, 1, 2, 3, 4]


def test_a_record_read_is_a_copy_so_mutating_it_changes_no_later_read():
    source = SharedMemoryDataSource([{"tokens": [1, 2]}])
    source[0]["tokens"].append(3)
    assert source[0] == {"tokens": [1, 2]}


def test_an_empty_sequence_is_a_source_of_length_zero():
    before = _blocks()
    source = SharedMemoryDataSource([])
    assert len(source) == 0 and list(source) == [] and source.__getitems__([]) == []
    with pytest.raises(IndexError, match=r"index 0 is out of range for a source of length 0"):
        source[0]
    assert len(pickle.loads(pickle.dumps(source))) == 0
    del source
    gc.collect()
    assert _blocks() == before


def test_neither_elements_nor_name_is_refused():
    with pytest.raises(ValueError, match=r"needs records or the name of a block to read; pass"):
        SharedMemoryDataSource()


def test_a_named_block_is_read_by_name_alone_and_str_is_graines():
    name = _shm_name("named")
    source = SharedMemoryDataSource(list(range(12)), name=name)
    assert source.name == name and _exists(name)
    assert str(source) == f"InMemoryDataSource(name={name}, len=12)"
    reader = SharedMemoryDataSource(name=name)
    assert [reader[i] for i in (3, 11)] == [3, 11] and len(reader) == 12
    assert repr(reader) == repr(source) and repr(source).endswith(f", name={name!r})")
    assert SharedMemoryDataSource(name="/" + name)[5] == 5  # the POSIX spelling
    source.close()
    source.unlink()  # Grain's users close, then unlink: the second is a no-op here
    assert not _exists(name)


@pytest.mark.multiprocess
@pytest.mark.timeout(300)  # spawned interpreters: seconds idle, far more on a loaded machine
def test_processes_read_a_named_block_together():
    """Grain's own co-read test: three spawned processes read one named source."""
    name = _shm_name("coread")
    source = SharedMemoryDataSource(list(range(12)), name=name)
    indices = [[1, 3, 5], [2, 3, 4], [5, 2, 3]]
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        results = pool.starmap(read_in_child, [(source, i) for i in indices])
    assert [records for _, records in results] == indices
    assert all(pid != os.getpid() for pid, _ in results)
    source.close()
    assert not _exists(name)


@pytest.mark.multiprocess
@pytest.mark.timeout(300)  # spawned interpreters: seconds idle, far more on a loaded machine
def test_another_python_process_attaches_by_name():
    name = _shm_name("attach")
    source = SharedMemoryDataSource(["a", "bc"], name=name)
    code = f"from dataloader.sources import SharedMemoryDataSource as S; s = S(name={name!r}); print(s[1], len(s))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert out.stdout.split() == ["bc", "2"], out.stderr
    assert _exists(name)  # the attaching process ended without removing the maker's block
    del source
    gc.collect()
    assert not _exists(name)


def test_only_the_maker_removes_a_named_block_when_collected():
    name = _shm_name("gc")
    source = SharedMemoryDataSource([1, 2], name=name)
    reader, copy = SharedMemoryDataSource(name=name), pickle.loads(pickle.dumps(source))
    del reader, copy
    gc.collect()
    assert _exists(name)
    del source
    gc.collect()
    assert not _exists(name)


def test_closing_the_maker_removes_the_block_and_refuses_later_reads():
    name = _shm_name("close")
    with SharedMemoryDataSource([b"x", b"y"], name=name) as source:
        reader = SharedMemoryDataSource(name=name)
    assert not _exists(name)
    assert reader[1] == b"y"  # a mapping made before keeps reading
    with pytest.raises(ValueError, match=r"SharedMemoryDataSource\(<bytes of 2 records.* is closed"):
        source[0]


def test_unlink_from_a_reader_removes_the_name():
    name = _shm_name("unlink")
    source = SharedMemoryDataSource([1], name=name)
    SharedMemoryDataSource(name=name).unlink()
    assert not _exists(name) and source[0] == 1


def test_a_name_already_taken_is_refused():
    name = _shm_name("taken")
    source = SharedMemoryDataSource([1], name=name)
    with pytest.raises(FileExistsError, match=rf"block named '{name}' already exists; read it with "
                       rf"SharedMemoryDataSource\(name='{name}'\)"):
        SharedMemoryDataSource([2], name=name)
    assert source[0] == 1


def test_a_missing_name_is_named():
    name = _shm_name("missing")
    with pytest.raises(FileNotFoundError, match=rf"no shared-memory block is named '{name}'; make it first"):
        SharedMemoryDataSource(name=name)


def test_a_block_made_by_something_else_is_refused():
    name = _shm_name("foreign")
    path = os.path.join("/dev/shm", name)
    with open(path, "wb") as f:
        f.write(b"\0" * 64)
    try:
        with pytest.raises(ValueError, match=rf"block '{name}' was not made by SharedMemoryDataSource"):
            SharedMemoryDataSource(name=name)
    finally:
        os.unlink(path)


@pytest.mark.parametrize(("name", "error", "match"), [
    ("a/b", ValueError, r"name 'a/b' is not a shared-memory block name"),
    ("", ValueError, r"name '' is not a shared-memory block name"),
    ("x" * 256, ValueError, r"up to 255 characters"),
    ("granary_1_src_ab", ValueError, r"starts with 'granary_', which marks the loader's own blocks"),
    (7, TypeError, r"name must be a str, got int 7"),
])
def test_bad_names_are_refused(name, error, match):
    with pytest.raises(error, match=match):
        SharedMemoryDataSource([1], name=name)


@pytest.mark.timeout(300)  # spawned interpreters: seconds idle, far more on a loaded machine
def test_a_named_block_left_by_a_killed_maker_is_replaced_by_the_next_one():
    name = _shm_name("killed")
    code = (f"import os, signal; from dataloader.sources import SharedMemoryDataSource as S; "
            f"s = S([1, 2], name={name!r}); os.kill(os.getpid(), signal.SIGKILL)")
    subprocess.run([sys.executable, "-c", code], timeout=240)
    assert _exists(name) and SharedMemoryDataSource(name=name)[1] == 2  # left behind
    source = SharedMemoryDataSource(["new"], name=name)
    assert source[0] == "new" and len(source) == 1
    source.close()
    assert not _exists(name)


@pytest.mark.multiprocess
@pytest.mark.timeout(300)  # spawned interpreters: seconds idle, far more on a loaded machine
def test_a_block_a_killed_maker_named_itself_is_swept_by_the_next_source():
    code = ("import os, signal; from dataloader.sources import SharedMemoryDataSource as S; "
            "s = S([1, 2]); print(s.name, flush=True); os.kill(os.getpid(), signal.SIGKILL)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    left = out.stdout.split()[0]
    assert _exists(left)  # nobody removed it: its maker was killed
    source = SharedMemoryDataSource([3])  # making a source sweeps what no process holds
    assert not _exists(left) and _exists(source.name)
    source.close()


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_a_block_some_process_holds_is_never_swept_whatever_its_name_says():
    # A maker in another PID namespace (docker --ipc=host) looks dead from here: its
    # block is renamed after a pid that runs nowhere here, and it must survive.
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    code = ("import os, sys; from dataloader.sources import SharedMemoryDataSource as S; "
            f"s = S([1, 2]); new = s.name.replace(f'_{{os.getpid()}}_', '_{gone.pid}_'); "
            "os.rename('/dev/shm/' + s.name, '/dev/shm/' + new); print(new, flush=True); sys.stdin.read()")
    holder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        held = holder.stdout.readline().split()[0]
        assert f"_{gone.pid}_src_" in held
        source = SharedMemoryDataSource([3])  # sweeps: the held block stays
        assert _exists(held) and SharedMemoryDataSource(name=held)[1] == 2
        source.close()
    finally:
        holder.stdin.close()
        holder.wait(timeout=240)
        # Its maker removes the name it made, not this one: the test does.
        with contextlib.suppress(FileNotFoundError, NameError):
            os.unlink(f"/dev/shm/{held}")


@pytest.mark.parametrize("name", [None, "gtest_full"])
def test_a_full_dev_shm_is_an_error_naming_it_the_size_the_room_and_what_to_do(monkeypatch, name):
    """What posix_fallocate says on a full /dev/shm (Docker's 64 MiB), injected: the real
    one is not filled. Nothing is left behind."""
    def full(fd, offset, size):
        raise OSError(errno.ENOSPC, "No space left on device")

    name = name and _shm_name(name)
    before = set(os.listdir("/dev/shm"))
    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(OSError, match=r"^\[Errno 28\] /dev/shm has no room for a shared-memory block of 7\.6 MiB "
                       r"\(\d+\.\d MiB free of \d+ MiB\): .*docker run --shm-size=.*InMemoryDataSource\(array\)") as info:
        SharedMemoryDataSource(np.zeros((1000, 1000)), name=name)
    assert info.value.errno == errno.ENOSPC and info.value.filename.startswith("/dev/shm/")
    assert set(os.listdir("/dev/shm")) <= before
