"""The worker pool: same output for every worker count, restores, errors, dead workers."""

from __future__ import annotations

import json
import os
import signal
import threading

import numpy as np
import pytest

import dataloader as dl
from tests.dataloader.pipelines import make_loader
from tests.helpers import assert_restores_everywhere, assert_streams_equal, take
from tests.integration import workers_pipelines as wp
from tests.integration.conftest import wait_until

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]


KINDS = ["processes", "threads", "auto"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", ["batch", "random_map_batch", "filter_batch", "flat_map", "everything", "batch_then_flat_map"])
def test_output_is_identical_for_worker_counts_0_1_2_3(name, kind):
    reference = list(make_loader(name, n=61, epochs=2))
    for workers, buffer in [(1, 1), (2, 2), (3, 4)]:
        got = list(make_loader(name, n=61, epochs=2, worker_count=workers, worker_buffer_size=buffer, worker_kind=kind))
        assert_streams_equal(got, reference)


def test_output_is_identical_with_and_without_warm_start():
    reference = list(make_loader("everything", n=40, epochs=1))
    for warm in (False, True):
        got = list(make_loader("everything", n=40, epochs=1, worker_count=2, warm_start=warm))
        assert_streams_equal(got, reference)


def test_warm_start_computes_units_here_until_a_worker_is_ready_and_then_none(tmp_path):
    marker, release = str(tmp_path / "in-init"), str(tmp_path / "go")
    source, sampler, ops = dl.RangeDataSource(40), dl.SequentialSampler(40), [dl.Batch(4)]
    reference = list(dl.DataLoader(source, sampler, ops))
    loader = dl.DataLoader(source, sampler, ops, worker_count=2, warm_start=True,  # the opt-in
                           worker_init_fn=wp.gated_init(marker, release))
    it = iter(loader)
    got = [next(it) for _ in range(3)]  # the workers wait in their init: all made here
    assert it.stats()["workers"]["main"]["units"] == 3
    open(release, "w").close()
    assert wait_until(lambda: len(os.listdir(tmp_path)) == 3)  # both workers were in init
    # Until the parent has taken a worker's Ready in, next() may still compute here: wait
    # for that (the start-up thread takes it in while the consumer is away), rather than
    # for a second that a busy machine may not keep to.
    workers = it._executor._workers.workers
    assert wait_until(lambda: any(w.ready for w in workers))
    got += list(it)
    workers = it.stats()["workers"]
    it.close()
    assert_streams_equal(got, reference)
    assert workers["main"]["units"] == 3  # none once a worker was ready
    assert sum(w["units"] for key, w in workers.items() if key != "main") == 7


@pytest.mark.parametrize("kind", ["processes", "threads"])
def test_the_window_fills_while_the_consumer_is_away_and_a_worker_is_not_ready(kind, tmp_path):
    """The consumer takes in what workers say only inside next(). While a worker is not
    ready yet (its init is slow), the start-up thread goes on doing that between calls: it
    takes in the ready worker's answers and sends it the window's room, and takes the late
    worker in when it is ready, so units are computed during the training step, not only
    at the consumer's next call."""
    marks, release = tmp_path / "marks", str(tmp_path / "go")
    marks.mkdir()
    loader = dl.DataLoader(
        dl.RangeDataSource(80), dl.SequentialSampler(80), [dl.MapTransform(wp.mark_each(str(marks))), dl.Batch(4)],
        worker_count=2, worker_buffer_size=1, warm_start=False, worker_kind=kind,
        worker_init_fn=wp.gated_init(str(tmp_path / "in-init"), release, only=1))
    it = iter(loader)
    got = [next(it).tolist() for _ in range(3)]  # worker 0 alone, one unit at a time
    # Units 3 and 4 (the window past the head) computed by worker 0 without a next():
    # before, unit 4 waited for the next call, as did a worker ready in the meantime.
    assert wait_until(lambda: len(os.listdir(marks)) == 20)
    assert os.path.exists(tmp_path / "in-init-1")  # worker 1 still in its init
    assert it.stats()["workers"].keys() == {"0"}
    open(release, "w").close()
    workers = it._executor._workers.workers
    assert wait_until(lambda: all(w.ready for w in workers))  # taken in, the consumer away
    got += [b.tolist() for b in it]
    it.close()
    assert got == [list(range(i, i + 4)) for i in range(0, 80, 4)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", ["batch", "everything", "flat_map"])
def test_restore_at_every_step_with_workers(name, kind):
    loader = make_loader(name, worker_count=2, worker_kind=kind)
    reference = list(make_loader(name))[:40]
    outputs = assert_restores_everywhere(lambda: iter(loader), limit=40, fresh_iterator_every=10)
    assert_streams_equal(outputs, reference)


@pytest.mark.parametrize(("save_kind", "restore_kind"), [("processes", "processes"), ("threads", "processes"), ("processes", "threads"), ("auto", "threads")])
@pytest.mark.parametrize(("save_workers", "restore_workers"), [(2, 0), (0, 3), (3, 1), (1, 2)])
def test_state_saved_with_n_workers_restores_with_m(save_workers, restore_workers, save_kind, restore_kind):
    """A state moves between worker counts and between kinds of worker."""
    name = "everything"
    reference = list(make_loader(name, n=50, epochs=2))
    saving = iter(make_loader(name, n=50, epochs=2, worker_count=save_workers, worker_kind=save_kind))
    states = []
    for _ in range(len(reference)):
        next(saving)
        states.append(json.dumps(saving.get_state()))
    saving.close()
    restoring = iter(make_loader(name, n=50, epochs=2, worker_count=restore_workers, worker_kind=restore_kind))
    for k in range(0, len(reference), 3):
        restoring.set_state(json.loads(states[k]))
        assert_streams_equal(take(restoring, 4), reference[k + 1 : k + 5])
    restoring.close()


def test_state_ignores_what_is_in_flight():
    loader = make_loader("batch", n=200, epochs=1, worker_count=2, worker_buffer_size=4)
    it = iter(loader)
    next(it)
    next(it)
    assert it.get_state()["position"] == 8  # two batches of 4, whatever is prefetched
    it.close()


def _views_a_shared_block(array) -> bool:
    import ctypes

    x = array
    while isinstance(x, (np.ndarray, memoryview)):
        x = x.base if isinstance(x, np.ndarray) else x.obj
    return isinstance(x, ctypes.Array)


def test_batches_arrive_through_shared_memory_and_free_their_blocks():
    src = dl.RangeDataSource(400)
    loader = dl.DataLoader(src, dl.SequentialSampler(400), [dl.MapTransform(wp.to_array), dl.Batch(8)], worker_count=2,
                           warm_start=False)
    it = iter(loader)
    batches = [next(it) for _ in range(30)]
    # Every batch views shared memory, the first ones too (sent before any size was
    # known, in small blocks that their workers grew): the base chain ends in the block
    # pool's ctypes holder, not in pipe-borne bytes.
    assert all(_views_a_shared_block(b["x"]) for b in batches)
    pool = it._executor._workers.transport.blocks
    assert pool.target_size > 0 and len(pool) >= 1
    held = len(pool)
    del batches
    rest = [next(it) for _ in range(20)]
    assert len(pool) <= held + 2  # freed blocks were reused, not new ones made
    assert rest[-1]["id"].tolist() == list(range(392, 400))
    it.close()


def test_results_that_outgrow_their_blocks_still_travel_in_blocks_and_are_identical():
    # Small results first (blocks sized for them), then 2 MiB per record: the workers
    # grow the blocks they were lent, the parent makes larger ones from then on.
    loader = dl.DataLoader(dl.RangeDataSource(64), dl.SequentialSampler(64),
                           [dl.MapTransform(wp.grow_at(24, 2 * 2**20)), dl.Batch(4)], worker_count=2, warm_start=False)
    it = iter(loader)
    got = list(it)
    assert [b["id"].tolist() for b in got] == [list(range(i, i + 4)) for i in range(0, 64, 4)]
    for b in got:
        assert (b["x"] == (b["id"] % 256)[:, None].astype(np.uint8)).all()
    assert got[0]["x"].shape == (4, 64) and got[-1]["x"].shape == (4, 2 * 2**20)
    assert all(_views_a_shared_block(b["x"]) for b in got)
    assert it.stats()["pipe_units"] == 0


def test_memory_shortage_falls_back_to_pipes_with_one_warning(monkeypatch):
    from dataloader.engine.pool import shm

    monkeypatch.setattr(shm, "block_room", lambda: 1000)
    loader = dl.DataLoader(dl.RangeDataSource(64), dl.SequentialSampler(64), [dl.MapTransform(wp.to_array), dl.Batch(8)], worker_count=2)
    with pytest.warns(RuntimeWarning, match=r"memory left \(0 MiB\) cannot hold the result blocks .* results travel through pipes"):
        got = list(loader)
    assert [b["id"].tolist() for b in got] == [list(range(i, i + 8)) for i in range(0, 64, 8)]


def test_without_memfd_results_travel_through_pipes_with_one_warning(monkeypatch):
    made = os.memfd_create

    def refused(name, flags=0):
        if name.startswith("granary-progress"):  # the stall checks' board: not this test's
            return made(name, flags)
        raise OSError(38, "Function not implemented")  # ENOSYS: an old kernel, or seccomp

    monkeypatch.setattr(os, "memfd_create", refused)
    loader = dl.DataLoader(dl.RangeDataSource(64), dl.SequentialSampler(64), [dl.MapTransform(wp.to_array), dl.Batch(8)],
                           worker_count=2, warm_start=False)
    with pytest.warns(RuntimeWarning, match=r"memfd_create.* results travel through pipes") as warned:
        got = list(loader)
    assert len([w for w in warned if "travel through pipes" in str(w.message)]) == 1
    assert [b["id"].tolist() for b in got] == [list(range(i, i + 8)) for i in range(0, 64, 8)]
    assert not any(_views_a_shared_block(b["x"]) for b in got)


def test_worker_error_arrives_at_its_place_with_operation_record_and_traceback():
    loader = dl.DataLoader(
        dl.RangeDataSource(40), dl.SequentialSampler(40),
        [dl.MapTransform(wp.raise_on_17), dl.Batch(4)], worker_count=2, warm_start=False,
    )
    it = iter(loader)
    got = [next(it).tolist() for _ in range(4)]
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    with pytest.raises(dl.PipelineError, match=r"(?s)MapTransform\(raise_on_17\) failed on record 17 .*ZeroDivisionError: record 17 is cursed.*Traceback in worker .*raise_on_17") as info:
        next(it)
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert info.value.record_index == 17
    assert it._executor.pids == []  # every child was stopped
    # A restore past the bad record starts a fresh pool and goes on.
    state = it.get_state()
    state["position"] = 20
    it.set_state(state)
    assert next(it).tolist() == [20, 21, 22, 23]
    it.close()


def test_sigkilled_worker_is_replaced_and_output_is_identical():
    def make(workers):
        return dl.DataLoader(
            dl.RangeDataSource(300), dl.IndexSampler(300, shuffle=True, seed=4, num_epochs=1),
            [dl.MapTransform(wp.slow_identity), dl.MapTransform(wp.to_array), dl.Batch(10)],
            worker_count=workers,
        )

    reference = list(make(0))
    it = iter(make(2))
    got = [next(it) for _ in range(5)]
    victim = it._executor.pids[0]
    os.kill(victim, signal.SIGKILL)
    got += list(it)
    assert victim not in it._executor.pids
    assert_streams_equal(got, reference)
    it.close()


def test_a_worker_killed_once_by_a_record_is_survived(tmp_path):
    loader = dl.DataLoader(
        dl.RangeDataSource(60), dl.SequentialSampler(60),
        [dl.MapTransform(wp.kill_once_marker(str(tmp_path / "seen"))), dl.Batch(5)],
        worker_count=2, warm_start=False,
    )
    assert [b.tolist() for b in loader] == [list(range(i, i + 5)) for i in range(0, 60, 5)]


@pytest.mark.parametrize("warm_start", [True, False])
def test_poison_record_that_always_kills_its_worker_is_named(warm_start, tmp_path):
    # With warm start, this process computes units until a worker is ready: the workers
    # are held in their init until the first unit (computed here) lets them go, so the
    # poison record is sure to reach a worker, not the test process.
    marker, release = str(tmp_path / "in-init"), str(tmp_path / "go")
    loader = dl.DataLoader(
        dl.RangeDataSource(60), dl.SequentialSampler(60),
        [dl.MapTransform(wp.open_gate_on(0, marker, release)), dl.MapTransform(wp.kill_self_on(23)),
         dl.Batch(5)],
        worker_count=2, warm_start=warm_start, worker_init_fn=wp.gated_init(marker, release),
    )
    if not warm_start:
        open(release, "w").close()
    it = iter(loader)
    got = [next(it).tolist() for _ in range(4)]
    assert got[-1] == [15, 16, 17, 18, 19]
    with pytest.raises(dl.WorkerCrashError, match=r"positions \[20, 25\) killed its worker 3 times \(last: signal 9\); it reads record indices \[20, 21, 22, 23, 24\]"):
        next(it)
    it.close()


def test_unpicklable_operation_is_named_at_construction():
    lock = threading.Lock()
    with pytest.raises(TypeError, match=r"operations\[0\]\._fn\.__closure__\[.lock.\] \(a _thread.lock: .*\), in operation MapTransform\(.*<lambda>\), cannot be sent to worker processes.*lock"):
        dl.DataLoader(dl.RangeDataSource(10), dl.IndexSampler(10), [dl.MapTransform(lambda x: (lock, x))], worker_count=2)


def test_worker_init_fn_runs_once_in_each_worker(tmp_path):
    loader = dl.DataLoader(
        dl.RangeDataSource(50), dl.SequentialSampler(50), [dl.Batch(5)],
        worker_count=3, worker_init_fn=wp.record_init(str(tmp_path)), warm_start=False,
    )
    it = iter(loader)
    assert len(list(it)) == 10
    # Tiny units may all be done before the last worker has started; wait for it.
    assert wait_until(lambda: len(os.listdir(tmp_path)) == 3)
    it.close()
    names = sorted(n.rsplit("-", 1)[0] for n in os.listdir(tmp_path))
    assert names == ["0-of-3", "1-of-3", "2-of-3"]


def test_lambdas_and_local_functions_run_in_workers():
    offset = 1000

    def local(x):
        return x + offset

    loader = dl.DataLoader(
        dl.RangeDataSource(20), dl.SequentialSampler(20),
        [dl.MapTransform(local), dl.MapTransform(lambda x: x * 2), dl.Batch(10)], worker_count=2,
    )
    assert [b.tolist() for b in loader] == [[(i + 1000) * 2 for i in range(10)], [(i + 1000) * 2 for i in range(10, 20)]]


def test_workers_start_computing_before_the_first_next():
    loader = dl.DataLoader(
        dl.RangeDataSource(400), dl.SequentialSampler(400), [dl.MapTransform(wp.to_array), dl.Batch(8)],
        worker_count=2, worker_buffer_size=2,
    )
    it = iter(loader)
    executor = it._executor
    # While the "training script" sets up, the workers start and take the first units.
    assert wait_until(lambda: executor._window.buffered >= 2)
    assert executor._window.has_finished(0) and executor._window.has_finished(1)
    assert next(it)["id"].tolist() == list(range(8))
    it.close()
