"""The process's bounded cache of open files, alone and under the file sources."""

from __future__ import annotations

import json
import pickle
import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dataloader as dl
from dataloader.sources.files.handles import OpenFiles
from tests.helpers import open_files_under, python_script, run_threads


class Handle:
    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name = log, name
        log.append(f"open {name}")

    def close(self) -> None:
        self.log.append(f"close {self.name}")


def opener(log: list[str]):
    return lambda key: Handle(log, key)


def test_the_least_recently_used_unheld_handle_is_closed_beyond_the_limit():
    log: list[str] = []
    files = OpenFiles(limit=2)
    for key in ["a", "b", "a", "c"]:  # "a" was used after "b": "b" goes
        files.acquire(key, opener(log))
        files.release(key)
    assert log == ["open a", "open b", "open c", "close b"]
    assert len(files) == 2 and "a" in files and "c" in files
    assert (files.opened, files.evicted) == (3, 1)


def test_a_handle_in_use_is_never_closed_and_the_limit_holds_again_at_release():
    log: list[str] = []
    files = OpenFiles(limit=1)
    with files.hold(["a", "b"], opener(log)) as (a, _):
        assert len(files) == 2 and log == ["open a", "open b"]  # both held: over the limit
        with files.hold(["a"], opener(log)) as (again,):
            assert again is a  # one handle a key, whoever holds it
    assert log == ["open a", "open b", "close a"] and len(files) == 1


def test_closing_a_held_handle_closes_it_at_its_release():
    log: list[str] = []
    files = OpenFiles()
    handle = files.acquire("a", opener(log))
    files.close(["a", "never opened"])
    assert log == ["open a"] and "a" in files
    files.release("a")
    assert log == ["open a", "close a"] and len(files) == 0
    assert files.acquire("a", opener(log)) is not handle  # reopened on demand


def test_a_finalizer_closing_files_inside_an_opener_or_a_close_does_not_deadlock():
    # A source's finalizer calls close(); the garbage collector runs it in whatever thread
    # allocates, here inside an opener and inside a handle's close(), with the cache's lock
    # held by that same thread (pyarrow opening a Parquet file hung on it before).
    log: list[str] = []
    files = OpenFiles(limit=1)
    files.acquire("old", opener(log))
    files.release("old")

    class Collecting(Handle):
        def close(self) -> None:
            files.close(["gone"])  # a finalizer run by the collector during close()
            super().close()

    def opening(key):
        files.close(["old"])  # a finalizer run by the collector during the open
        return Collecting(log, key)

    finished: list[bool] = []
    thread = threading.Thread(
        target=lambda: finished.append(bool(files.acquire("new", opening))), daemon=True
    )
    thread.start()
    thread.join(timeout=120)  # a deadlock never ends; this only keeps the suite from hanging
    assert finished == [True], "acquire() deadlocked on a close() from inside its opener"
    assert log == ["open old", "close old", "open new"] and "old" not in files
    files.release("new")
    files.acquire("gone", opener(log))
    assert log[-1] == "close new"
    files.release("gone")
    # Over the limit "new" closed, and its close() closed the held "gone", at its release.
    assert log[-3:] == ["open gone", "close new", "close gone"] and len(files) == 0


def test_an_opener_that_fails_leaves_nothing_held():
    files = OpenFiles(limit=1)

    def broken(key):
        raise FileNotFoundError(key)

    with pytest.raises(FileNotFoundError), files.hold(["a"], broken):
        pass
    assert len(files) == 0
    log: list[str] = []
    with files.hold(["b"], opener(log)):
        pass
    assert log == ["open b"]


def test_lowering_the_limit_closes_the_excess_now():
    log: list[str] = []
    files = OpenFiles(limit=3)
    for key in "abc":
        files.acquire(key, opener(log))
        files.release(key)
    files.set_limit(1)
    assert log[3:] == ["close a", "close b"] and len(files) == 1


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "8", None])
def test_a_limit_that_is_not_a_positive_int_is_refused(bad):
    with pytest.raises(ValueError, match=rf"max_open_files is {bad!r}; pass the number of files"):
        dl.set_max_open_files(bad)


def test_threads_reading_many_files_never_see_a_closed_handle():
    files = OpenFiles(limit=3)
    closed: list[int] = []

    class Counted:
        def __init__(self, key: int) -> None:
            self.key, self.open = key, True

        def read(self) -> int:
            assert self.open, "read from a closed handle"
            return self.key

        def close(self) -> None:
            self.open = False
            closed.append(self.key)

    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            for i in range(2000):
                key = (seed * 7 + i * 13) % 17
                with files.hold([key, (key + 1) % 17], Counted) as handles:
                    assert [h.read() for h in handles] == [key, (key + 1) % 17]
        except BaseException as error:
            errors.append(error)

    run_threads(work, 4)
    assert not errors, errors[0]
    assert len(files) <= 3 and closed


def _mixture_sources(folder, count: int):
    """``count`` single-file sources of each kind that reads through the cache."""
    array_records, parquets, tfrecords = [], [], []
    for i in range(count):
        path = folder / f"a{i}.array_record"
        dl.write_array_record(path, [b"a%d-%d" % (i, r) for r in range(3)])
        array_records.append(dl.ArrayRecordDataSource(str(path)))
        path = folder / f"p{i}.parquet"
        pq.write_table(pa.table({"x": [i * 10 + r for r in range(3)]}), path)
        parquets.append(dl.ParquetDataSource(str(path)))
        path = folder / f"t{i}.tfrecord"
        dl.write_tfrecord(path, [b"t%d-%d" % (i, r) for r in range(3)])
        tfrecords.append(str(path))
    return array_records, parquets, tfrecords


def test_many_file_sources_keep_at_most_the_limit_open_and_read_right(tmp_path):
    pytest.importorskip("google_crc32c")
    limit = dl.max_open_files()
    dl.set_max_open_files(5)
    try:
        array_records, parquets, tfrecords = _mixture_sources(tmp_path, 12)
        streams = dl.experimental.TFRecordIterDataset(tfrecords).map(bytes)
        for round_ in range(2):  # the second round reopens what the first closed
            for i in range(12):
                assert array_records[i][2] == b"a%d-2" % i
                assert array_records[i].__getitems__([1, 0]) == [b"a%d-1" % i, b"a%d-0" % i]
                assert int(parquets[i][1]["x"]) == i * 10 + 1
                assert len(open_files_under(tmp_path)) <= 5, round_
        assert sorted(streams) == sorted(b"t%d-%d" % (i, r) for i in range(12) for r in range(3))
        assert len(open_files_under(tmp_path)) <= 5
    finally:
        dl.set_max_open_files(limit)


def test_a_closed_or_collected_source_leaves_no_file_open(tmp_path):
    import gc

    dl.write_array_record(tmp_path / "x.array_record", [b"x"])
    source = dl.ArrayRecordDataSource(str(tmp_path / "x.array_record"))
    assert source[0] == b"x" and open_files_under(tmp_path)
    source.close()
    assert not open_files_under(tmp_path)
    assert source[0] == b"x" and open_files_under(tmp_path)  # reopened
    del source
    gc.collect()
    assert not open_files_under(tmp_path)


def test_the_limit_travels_with_a_pickled_source_to_another_process(tmp_path):
    dl.write_array_record(tmp_path / "x.array_record", [b"x"])
    limit = dl.max_open_files()
    dl.set_max_open_files(7)
    try:
        data = pickle.dumps(dl.ArrayRecordDataSource(str(tmp_path / "x.array_record")))
    finally:
        dl.set_max_open_files(limit)
    with python_script(f"""
        import json, pickle
        import dataloader as dl
        before = dl.max_open_files()
        source = pickle.loads({data!r})
        print(json.dumps([before, dl.max_open_files(), source[0].decode()]))
    """) as proc:
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert json.loads(out) == [128, 7, "x"]


def test_a_forked_child_reads_through_handles_of_its_own(tmp_path):
    """Forked from a fresh process with no threads (a fork of the test process, where
    JAX runs threads, could deadlock)."""
    (tmp_path / "x.jsonl").write_text('"x"\n"y"\n')
    with python_script(f"""
        import os
        import dataloader as dl
        from dataloader.sources.files.handles import OPEN_FILES
        source = dl.JsonlDataSource({str(tmp_path / "x.jsonl")!r}, parse="bytes", index=False)
        assert source[0] == b'"x"' and len(OPEN_FILES) == 1
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(write, b"%d %s" % (len(OPEN_FILES), source[1]))
            os._exit(0)
        os.close(write)
        assert os.waitpid(pid, 0)[1] == 0
        print(os.read(read, 64).decode(), source[1].decode(), len(OPEN_FILES))
    """) as proc:
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert out.split() == ["0", '"y"', '"y"', "1"]  # the child started with none of its parent's


def test_a_source_travels_as_its_paths_and_counts_whatever_it_has_read(tmp_path):
    """What a mixture of N sources costs a process and each worker is N times this."""
    path = tmp_path / "x.array_record"
    dl.write_array_record(path, [b"%d" % i for i in range(1000)])
    source = dl.ArrayRecordDataSource(str(path))
    before = len(pickle.dumps(source))
    assert source.__getitems__(range(1000))[999] == b"999"
    assert len(pickle.dumps(source)) == before < 1024
