"""The loader tells a remote source which records come next (``prefetch``), so their
chunks are fetched while the unit before them is computed; the records it reads are the
same with hints on or off, with or without worker processes."""

from __future__ import annotations

import logging
import os
import pickle
import queue
import threading
from multiprocessing.connection import Pipe

import numpy as np
import pytest

pytest.importorskip("moto.server")
pytest.importorskip("s3fs")

import dataloader as dl
from dataloader.dataset.compile.concat_source import ConcatSource
from dataloader.engine.compute import hint_unit
from dataloader.engine.plan import make_plan
from dataloader.engine.pool.messages import Task
from dataloader.engine.pool.worker import _receive
from dataloader.sources import ArrayRecordDataSource, RemoteOptions, write_array_record

from ._object_store import BUCKET, FaultProxy, make_bucket, s3_server, storage_options

logging.getLogger("werkzeug").setLevel(logging.ERROR)
BATCH = 16


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Two files of small records (one chunk each) on moto, behind a counting proxy."""
    import s3fs

    patch = pytest.MonkeyPatch()
    patch.setattr(s3fs.S3FileSystem, "retries", 1)
    folder = tmp_path_factory.mktemp("hints")
    rng = np.random.default_rng(0)
    local = []
    for i, n in enumerate([300, 200]):
        path = folder / f"part-{i}.array_record"
        write_array_record(path, [rng.bytes(int(rng.integers(300, 900))) for _ in range(n)])
        local.append(str(path))
    with s3_server() as endpoint, FaultProxy(endpoint) as proxy:
        make_bucket(endpoint, {os.path.basename(p): p for p in local})
        yield {"proxy": proxy, "local": local, "folder": folder}
    patch.undo()


def _source(store, **remote) -> ArrayRecordDataSource:
    # No whole-file download and no coalescing beyond neighbours: every unit of
    # shuffled records needs chunks of its own.
    remote.setdefault("whole_file_bytes", 0)
    remote.setdefault("cache_dir", str(store["folder"] / "cache"))
    return ArrayRecordDataSource(
        f"s3://{BUCKET}/part-*.array_record",
        storage_options=storage_options(store["proxy"].url),
        remote=RemoteOptions(**remote),
    )


def _sampler() -> dl.IndexSampler:
    return dl.IndexSampler(500, shuffle=True, seed=5, num_epochs=1)


def _drain(source: ArrayRecordDataSource) -> None:
    for pending in list(source._fetch_state()._pending):
        pending.result()


def test_in_process_units_are_fetched_before_they_are_read(store):
    """With worker_count=0 every unit after the first finds its chunks fetched: its own
    read makes no request. A map waits for the hint's fetch to end, so the test does
    not depend on how fast the fetch is."""
    local = ArrayRecordDataSource(store["local"])
    expected = [int(b.sum()) for b in dl.DataLoader(
        local, _sampler(), [dl.MapTransform(len), dl.Batch(BATCH)], worker_count=0)]
    with _source(store) as source:
        read_requests = []  # per unit: requests made by its own read

        def getitems(indices, _read=source.__getitems__):
            stats = source.remote_stats
            before = stats["requests"] - stats["prefetch_requests"]
            records = _read(indices)
            stats = source.remote_stats
            read_requests.append(stats["requests"] - stats["prefetch_requests"] - before)
            return records

        source.__getitems__ = getitems  # read_records looks the method up on the object

        def size_after_the_hint(record: bytes) -> int:
            _drain(source)
            return len(record)

        loader = dl.DataLoader(source, _sampler(), [dl.MapTransform(size_after_the_hint), dl.Batch(BATCH)],
                               worker_count=0)
        got = [int(b.sum()) for b in loader]
        assert got == expected
        assert len(read_requests) == len(expected) == 32
        assert read_requests[0] > 0
        assert read_requests[1:] == [0] * 31
        assert source.remote_stats["prefetch_requests"] > 0


def test_without_hints_each_unit_fetches_its_own_records(store):
    with _source(store, fetch_ahead=False) as source:
        loader = dl.DataLoader(source, _sampler(), [dl.MapTransform(len), dl.Batch(BATCH)], worker_count=0)
        assert len(list(loader)) == 32
        assert source.remote_stats["prefetch_requests"] == 0
        assert source.remote_stats["requests"] > 0


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("fetch_ahead", [True, False])
def test_records_are_the_same_with_hints_on_or_off_and_with_workers(store, fetch_ahead):
    local = ArrayRecordDataSource(store["local"])
    ops = [dl.MapTransform(lambda r: np.frombuffer(r, np.uint8).astype(np.int64).sum()), dl.Batch(BATCH)]
    expected = [b.tolist() for b in dl.DataLoader(local, _sampler(), ops, worker_count=0)]
    with _source(store, fetch_ahead=fetch_ahead) as source:
        for workers in (0, 2):
            got = [b.tolist() for b in dl.DataLoader(source, _sampler(), ops, worker_count=workers)]
            assert got == expected


def test_a_worker_hints_the_units_queued_behind_the_one_it_computes():
    """The worker's receiving thread: a task that arrives while another is queued or
    being computed is hinted; one that an idle worker starts at once is not."""
    parent, child = Pipe()
    queued: queue.Queue = queue.Queue()
    hinted: list[tuple[int, int]] = []
    thread = threading.Thread(
        target=_receive, args=(child, {}, queued, None, lambda a, b: hinted.append((a, b))), daemon=True
    )
    thread.start()
    parent.send_bytes(pickle.dumps(Task(0, 0, 0, 16, None, ())))
    first = queued.get()
    assert (first.start, first.stop) == (0, 16)  # the worker computes it now
    parent.send_bytes(pickle.dumps(Task(0, 1, 16, 32, None, ())))
    parent.send_bytes(pickle.dumps(Task(0, 2, 32, 48, None, ())))
    assert [queued.get().unit, queued.get().unit] == [1, 2]
    assert hinted == [(16, 32), (32, 48)]
    for _ in range(3):
        queued.task_done()
    parent.send_bytes(pickle.dumps(Task(0, 3, 48, 64, None, ())))  # the worker is idle again
    assert queued.get().unit == 3
    assert hinted == [(16, 32), (32, 48)]
    parent.close()
    assert queued.get() is None  # the channel closed: the worker ends
    thread.join(5)


class _Hinted:
    """A source that takes hints (``HintedDataSource``), recording them."""

    takes_hints = True

    def __init__(self, n: int) -> None:
        self.n, self.hints = n, []

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        return i

    def prefetch(self, indices) -> None:
        self.hints.append(np.asarray(indices).tolist())


def test_hints_reach_the_parts_of_a_mixture_and_cost_nothing_without_prefetch():
    a, b = _Hinted(10), _Hinted(5)
    ConcatSource([a, list(range(3)), b]).prefetch(np.array([17, 2, 12, 11, 99]))
    assert a.hints == [[2]] and b.hints == [[4]]  # 17 - 13; 99 is past the end: dropped
    plan = make_plan(a, dl.SequentialSampler(10), [])
    hint_unit(plan, 8, 14)  # cut at the stream's end
    assert a.hints[-1] == [8, 9]
    hint_unit(make_plan(list(range(10)), dl.SequentialSampler(10), []), 0, 4)  # no prefetch: nothing

    class Failing(_Hinted):
        def prefetch(self, indices) -> None:
            raise OSError("the store is down")

    hint_unit(make_plan(Failing(10), dl.SequentialSampler(10), []), 0, 4)  # a hint never raises


class _CountingSampler(dl.IndexSampler):
    """Counts the record indices it computes."""

    calls = 0

    def record_keys(self, positions):
        type(self).calls += 1
        return super().record_keys(positions)


def test_local_files_take_no_hint_and_no_index_is_computed_for_one(store):
    local = ArrayRecordDataSource(store["local"])
    assert isinstance(local, dl.HintedDataSource) and not local.takes_hints
    plan = make_plan(local, _CountingSampler(500, shuffle=True, seed=5, num_epochs=1), [])
    hint_unit(plan, 0, 16)
    assert _CountingSampler.calls == 0
    source = _Hinted(10)
    source.takes_hints = False  # a source that says hints do nothing for it now
    hint_unit(make_plan(source, dl.SequentialSampler(10), []), 0, 4)
    assert source.hints == []
    assert not ConcatSource([local, list(range(3))]).takes_hints
    assert ConcatSource([local, _Hinted(3)]).takes_hints
