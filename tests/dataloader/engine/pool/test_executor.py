"""The pool's scheduling loop, driven with a fake worker set: no process is started.

The fake implements the worker-set protocol (:class:`~dataloader.engine.pool.workers.Workers`). Its workers
compute their units in this process (with the real ``compute_unit``) but answer only
when the test lets them, in the order the test chooses; a worker dies when the test
says so. Nothing waits on a clock: a loop that would wait with nothing to come fails
the test at once.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

import dataloader as dl
from dataloader.engine.compute import compute_unit
from dataloader.engine.plan import make_plan
from dataloader.engine.pool.executor import PoolExecutor
from dataloader.engine.pool.messages import Done, Failed, Ready, Task, error_payload, remote_error
from dataloader.engine.pool.watch.progress import IDLE, Position
from dataloader.engine.pool.workers import MAX_CRASHES
from dataloader.errors import WorkerCrashError, WorkerError, WorkerTimeoutError
from dataloader.options import AutoWorkers

RECORDS, UNIT = 24, 4  # six units of four records


class Silence(Exception):
    """The loop would wait, but no fake worker has anything to say (a real pool would
    wait here; the test decides what happens next)."""


class FakeWorker:
    def __init__(self, index: int, key: int) -> None:
        self.index, self.key, self.pid = index, key, 1000 + key
        self.ready = self.retiring = False
        self.tasks: list[Any] = []  # sent, not answered yet
        self.units: list[int] = []  # every unit it was sent
        self.dead = False
        self.where = f"fake {key}"

    def send(self, task: Any, fds: tuple[int, ...] = ()) -> None:
        if self.dead:
            raise OSError("the worker is gone")
        self.tasks.append(task)
        self.units.append(task.unit)


class FakeWorkers:
    """Workers the test drives. ``answering``: the keys of workers that answer their
    tasks at the loop's next look, in the order listed (None: every ready worker,
    lowest slot first)."""

    made: list[FakeWorkers] = []
    kind, stop_words, stop_verb, handover = "fake", "the fake worker was dropped", "dropping it", None
    retries_stuck = False

    def __init__(self, slots: int) -> None:
        self.slots, self.plan = slots, None
        self.workers: list[FakeWorker] = []
        self.deferred: list[int] = []
        self.retired: list[FakeWorker] = []
        self.board = None
        self.stopping = self.closed = False
        self.inbox: list[tuple[FakeWorker, Any, int]] = []  # what the loop hears next
        self.answering: list[int] | None = None
        self.answered: list[int] = []  # units, in the order they were answered
        self.buried: list[FakeWorker] = []
        self.reaped: list[FakeWorker] = []
        self._keys = iter(range(10**6))
        self._closed = threading.Event()
        FakeWorkers.made.append(self)

    def _new(self, index: int) -> FakeWorker:
        w = FakeWorker(index, next(self._keys))
        self.inbox.append((w, Ready(w.pid), 0))  # ready at the loop's next look
        return w

    def send(self, w: FakeWorker, generation: int, unit: int, start: int, stop: int, blocks_needed: int) -> None:
        w.send(Task(generation, unit, start, stop, None, ()))

    def give_back(self, token: Any) -> None:
        assert token is None

    def result(self, w: FakeWorker, token: Any, message: Any, nbytes: int, blocks_needed: int) -> Any:
        message.result.worker = w.index
        return message.result

    def error(self, w: FakeWorker, payload: Any) -> Exception:
        return remote_error(payload, w.index)

    def note_local_result(self, result: Any, blocks_needed: int) -> None:
        pass

    def footprint(self) -> tuple[int, int, int, int | None]:
        return 0, 0, 0, None

    def describe(self) -> dict[str, Any]:
        return {"worker_kind": self.kind}

    def start(self, count: int, spare_a_core: bool) -> Iterator[FakeWorker]:
        for index in range(count):
            self.workers.append(self._new(index))
            yield self.workers[-1]

    def start_deferred(self) -> Iterator[FakeWorker]:
        return iter(())

    def add(self, count: int) -> Iterator[FakeWorker]:
        used = {w.index for w in self.workers}
        for index in [i for i in range(self.slots) if i not in used][:count]:
            self.workers.append(self._new(index))
            yield self.workers[-1]

    def kill(self, w: FakeWorker) -> None:
        w.dead = True
        self.inbox.append((w, None, 0))

    def events(self, timeout: float) -> Iterator[tuple[FakeWorker, Any, int]]:
        ready = [w for w in self.workers if w.ready and not w.dead]
        order = ready if self.answering is None else [w for k in self.answering for w in ready if w.key == k]
        for w in order:
            for task in w.tasks:
                result = compute_unit(self.plan, task.start, task.stop)
                self.inbox.append((w, Done(task.generation, task.unit, None, 100, result), 100))
                self.answered.append(task.unit)
            w.tasks = []
        if not self.inbox and timeout > 0:
            raise Silence
        while self.inbox:
            yield self.inbox.pop(0)

    def wait_readable(self, timeout: float) -> None:
        self._closed.wait()  # the start-up thread does nothing: the test drives the loop

    def bury(self, w: FakeWorker, timed_out: bool) -> int:
        self.buried.append(w)
        return -9

    def replace(self, w: FakeWorker) -> Iterator[FakeWorker]:
        i = self.workers.index(w)
        if not w.retiring:
            self.workers[i] = self._new(w.index)
            yield self.workers[i]
        else:
            del self.workers[i]

    def retire(self, count: int) -> list[FakeWorker]:
        chosen = sorted(self.live(), key=lambda w: -w.index)[:count]
        for w in chosen:
            w.retiring = True
        return chosen

    def stop(self, w: FakeWorker) -> None:
        self.workers.remove(w)
        self.retired.append(w)

    def reap_retired(self) -> None:
        self.reaped += self.retired
        self.retired.clear()

    def live(self) -> list[FakeWorker]:
        return [w for w in self.workers if not w.retiring]

    def worker_bytes(self) -> int:
        return 0

    def close(self) -> None:
        self.closed = True
        self._closed.set()


@pytest.fixture
def pool():
    """``pool(workers=2, buffer=2)``: an executor at position 0 and its fake workers."""
    made: list[PoolExecutor] = []

    def make(workers: Any = 2, buffer: int = 2):
        plan = make_plan(dl.RangeDataSource(RECORDS), dl.SequentialSampler(RECORDS), [], UNIT)
        executor = PoolExecutor(
            plan, b"", 0, worker_count=workers, buffer_size=buffer, warm_start=False,
            make_workers=FakeWorkers,
        )
        fake = FakeWorkers.made.pop()
        fake.plan = plan
        made.append(executor)
        return executor, fake

    yield make
    for executor in made:
        executor.close()


def records(results) -> list[int]:
    return [int(x) for r in results for x in r.outputs]


def test_units_go_out_in_order_to_the_least_loaded_worker_and_come_back_in_order(pool):
    executor, fake = pool(workers=2, buffer=2)
    a, b = fake.workers
    fake.answering = [b.key, a.key]  # the second worker always answers first
    assert records(executor) == list(range(RECORDS))
    assert a.units[:2] == [0, 2] and b.units[:2] == [1, 3]  # alternating: least loaded first
    assert fake.answered[:4] == [1, 3, 0, 2]  # out of order, yet the stream is in order


def test_no_more_units_are_sent_than_the_window_holds(pool):
    executor, fake = pool(workers=2, buffer=1)
    a, b = fake.workers
    fake.answering = [a.key]  # b never answers: its unit 1 holds the head back
    assert records([next(executor)]) == [0, 1, 2, 3]
    # Two units in flight per window of 2: unit 1 (b) and unit 2 (a); nothing past them.
    assert sorted(a.units + b.units) == [0, 1, 2]
    with pytest.raises(Silence):
        next(executor)


def test_a_dead_workers_units_go_to_its_successor_and_the_stream_is_unchanged(pool):
    executor, fake = pool(workers=2, buffer=2)
    a, b = fake.workers
    fake.answering = []  # nobody answers yet
    with pytest.raises(Silence):
        next(executor)  # both are ready and hold units 0..3, unanswered
    held, b_sent = list(a.units), len(b.units)
    assert held == [0, 2]
    fake.kill(a)
    fake.answering = None
    assert records(executor) == list(range(RECORDS))
    assert fake.buried == [a]
    successor = next(w for w in fake.workers if w.index == a.index)
    assert successor is not a
    resent = successor.units + b.units[b_sent:]
    assert set(held) <= set(resent)  # the dead worker's units were computed again


def test_a_unit_that_kills_its_worker_every_time_becomes_an_error_at_its_place(pool):
    executor, fake = pool(workers=1, buffer=1)
    assert records([next(executor)]) == [0, 1, 2, 3]
    fake.answering = []
    for _ in range(MAX_CRASHES):
        with pytest.raises(Silence):
            next(executor)  # unit 1 went out; its worker holds it
        fake.kill(fake.workers[0])
    with pytest.raises(WorkerCrashError, match=r"positions \[4, 8\) killed its worker 3 times"):
        next(executor)
    assert len(fake.buried) == MAX_CRASHES and fake.closed  # the error ended the stream


class Hanging(FakeWorkers):
    """Fake workers on a set that computes a stuck unit again elsewhere (as Ray actors'
    does); its board says each worker started its oldest unit at the clock's origin, so
    a unit held unanswered at a look is past any ``unit_timeout_s``."""

    retries_stuck = True

    def __init__(self, slots: int) -> None:
        super().__init__(slots)
        self.board = self

    def read(self, index: int) -> Position:
        w = next((w for w in self.workers if w.index == index and w.tasks), None)
        return Position(-1, 0, IDLE, 0) if w is None else Position(w.tasks[0].generation, w.tasks[0].unit, 0, 0)

    def kill(self, w: FakeWorker) -> None:
        w.dead = True  # the loop buries it at once: no death to hear later


def hanging_pool(pool):
    executor, fake = pool(workers=1, buffer=1)
    executor.close()
    plan = fake.plan
    # A timeout of 1 ns: the loop looks at every call (its looks are a quarter of it apart).
    executor = PoolExecutor(plan, b"", 0, worker_count=1, buffer_size=1, unit_timeout_s=1e-9, make_workers=Hanging)
    fake = FakeWorkers.made.pop()
    fake.plan = plan
    return executor, fake


def test_a_stuck_unit_on_a_set_that_retries_goes_to_another_worker_and_the_stream_is_unchanged(pool):
    executor, fake = hanging_pool(pool)
    try:
        fake.answering = []  # nobody answers: unit 0 is held past unit_timeout_s
        with pytest.raises(Silence):
            next(executor)
        first = fake.workers[0]
        with pytest.raises(Silence):
            next(executor)  # the look kills it; a successor starts
        assert fake.buried == [first] and first.units == [0]
        fake.answering = None
        assert records(executor) == list(range(RECORDS))
        assert fake.workers[0].units[0] == 0  # computed again by the successor
    finally:
        executor.close()


def test_a_unit_stuck_on_max_crashes_workers_in_turn_is_the_timeout_error_at_its_place(pool):
    executor, fake = hanging_pool(pool)
    try:
        fake.answering = []
        with pytest.raises(Silence):
            next(executor)
        for _ in range(MAX_CRASHES - 1):
            with pytest.raises(Silence):
                next(executor)  # killed, and the unit goes to the successor
        with pytest.raises(WorkerTimeoutError, match=r"computing unit 0 .* past unit_timeout_s=1e-09"):
            next(executor)
        assert len(fake.buried) == MAX_CRASHES
    finally:
        executor.close()


def test_a_unit_that_raised_in_its_worker_is_the_error_at_its_place(pool):
    executor, fake = pool(workers=1, buffer=2)
    w = fake.workers[0]
    fake.answering = []
    with pytest.raises(Silence):
        next(executor)
    task = w.tasks.pop(0)
    fake.inbox.append((w, Failed(task.generation, task.unit, error_payload(ValueError("bad record"))), 0))
    with pytest.raises(WorkerError, match="bad record"):
        next(executor)
    assert fake.closed


def test_a_reset_drops_the_answers_of_the_old_stream(pool):
    executor, fake = pool(workers=1, buffer=2)
    fake.answering = []
    with pytest.raises(Silence):
        next(executor)
    stale = list(fake.workers[0].tasks)  # units 0 and 1 of the first stream, unanswered
    executor.reset(12)
    fake.answering = None
    assert [t.unit for t in stale] == [0, 1]
    assert records(executor) == list(range(12, RECORDS))  # not records 0..7 of the old stream
    assert fake.answered == [0, 1, 0, 1, 2]  # the old units were answered, then dropped


class ScriptedScaler:
    """Stands in for autoscale.Scaler: its next decision is ``change``, then 0."""

    def __init__(self) -> None:
        self.change = 0

    def waited(self, seconds: float) -> None:
        pass

    def sample(self, idle: int) -> None:
        pass

    def decide(self, now: float, live: int, starting: bool, room: Any) -> int:
        change, self.change = self.change, 0
        return change


def test_autoscaling_adds_workers_and_retires_them_once_they_hold_nothing(pool):
    executor, fake = pool(workers=AutoWorkers(min_workers=1, max_workers=4, initial=2), buffer=1)
    assert fake.slots == 4 and len(fake.workers) == 2
    executor._scaling.scaler = scaler = ScriptedScaler()
    out = [next(executor)]
    scaler.change = +2
    out.append(next(executor))
    assert [w.index for w in fake.workers] == [0, 1, 2, 3]
    assert executor._window.size == 4  # one unit in flight per worker
    first = fake.workers[0]
    fake.answering = [first.key]  # only worker 0 answers from now on
    scaler.change = -3
    out.append(next(executor))
    retiring = [w for w in fake.workers if w.retiring]
    assert executor._window.size == 1
    assert retiring and all(w.tasks for w in retiring)  # they hold units: not stopped yet
    assert {w.index for w in [*retiring, *fake.retired, *fake.reaped]} == {1, 2, 3}
    fake.answering = None
    out += list(executor)
    assert records(out) == list(range(RECORDS))
    assert fake.workers == [first]  # the others answered what they held, and were stopped
    assert {w.index for w in fake.reaped} == {1, 2, 3}
    assert not any(w.units[-1] > 5 for w in retiring)
    assert [count for _, count in executor.worker_counts] == [2, 4, 1]


def test_a_worker_auto_wished_for_that_a_limit_refuses_leaves_the_pool_as_it_was(pool):
    # Under a pids limit the fork server may refuse a worker that autoscaling only wished
    # for: the pool stays at what started, stops wishing higher, and the stream goes on.
    from dataloader.errors import WorkerError

    executor, fake = pool(workers=AutoWorkers(min_workers=1, max_workers=4, initial=2), buffer=1)
    executor._scaling.scaler = scaler = ScriptedScaler()
    scaler.low, scaler.high = 1, 4
    grow = fake.add

    def add_one_then_refuse(count):
        yield from grow(1)
        raise WorkerError("could not start worker 3: the pids limit of this container is reached")

    fake.add = add_one_then_refuse
    out = [next(executor)]
    scaler.change = +2
    out += list(executor)
    assert records(out) == list(range(RECORDS))
    assert [w.index for w in fake.workers] == [0, 1, 2]
    assert scaler.high == 3
    assert [count for _, count in executor.worker_counts] == [2, 3]
    assert executor._window.size == 3


def test_close_releases_the_workers_and_ends_the_stream(pool):
    executor, fake = pool()
    assert records([next(executor)]) == [0, 1, 2, 3]
    executor.close()
    assert fake.closed and fake.stopping
    with pytest.raises(StopIteration):
        next(executor)
    executor.close()  # twice is fine
