"""The worker pool as an executor: unit results in unit order, computed by a worker set.

This is the one scheduling loop, run with a lock held (the threads: :mod:`~.guard`),
over two parts: the :class:`~.window.Window` (which unit goes to which worker, what the
consumer gets next, never more than ``worker_count * buffer_size`` units ahead of it,
which bounds memory) and the worker set (:class:`~.workers.Workers`: child processes,
:mod:`~.process_set`, with results in shared memory; threads of this process,
:mod:`~.thread_set`, with results handed over as objects; a fake in the loop's tests).
Order, balancing, retries and timeouts are the loop's, whatever the kind of worker.

User code runs in the workers only. The first batch comes fast because workers fork
from the training process's fork server in milliseconds
(:mod:`~dataloader.engine.pool.zygote`), or are threads. ``warm_start=True`` is the opt-in to compute
the units the consumer asks for in this process until a worker is ready: then a record
that crashes its process crashes the training process, ``worker_init_fn`` does not
apply to those units, and a result that does not pickle is not named.

A worker that dies (SIGKILL, OOM killer, segfault) closes its result pipe, which wakes
the parent at once: it is replaced and its units are computed again, so the output is
unchanged. A unit that killed its worker ``MAX_CRASHES`` times becomes an error at its
place in the stream. Exceptions, whatever their type (``SystemExit`` included), are not
deaths: they come back as the unit's error (see :mod:`~dataloader.engine.compute`).
While the consumer waits, the pool warns about units past ``stall_warning_s`` and kills
workers past ``unit_timeout_s`` (:mod:`~dataloader.engine.pool.watch.stalls`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from dataloader.engine.compute import UnitResult, compute_unit
from dataloader.engine.plan import Plan
from dataloader.engine.pool.autoscale.changes import Changes, Decider
from dataloader.engine.pool.autoscale.kind import worker_sets
from dataloader.engine.pool.autoscale.measure import Scaling
from dataloader.engine.pool.autoscale.oom import OomWatch
from dataloader.engine.pool.messages import Done, Failed, Fatal, Ready
from dataloader.engine.pool.watch.stalls import StallWatch, Stuck, crash_error
from dataloader.engine.pool.window import Outcome, Window
from dataloader.engine.pool.workers import MAX_CRASHES, Workers
from dataloader.errors import PipelineError, WorkerError
from dataloader.options import AutoWorkers

logger = logging.getLogger("dataloader")


class PoolExecutor(Changes):
    """Unit results in order, computed by a pool of workers.

    Implements :class:`~dataloader.engine.executor.Executor`.

    Args:
        plan: the pipeline's plan; ``plan_bytes`` its pickled form for processes (made
            once, at loader construction, so an unpicklable operation fails early).
        position: the local position to start from.
        worker_count, buffer_size: workers, and units in flight per worker. An
            :class:`~dataloader.options.AutoWorkers`: the count changes as the pool
            runs (:mod:`~dataloader.engine.pool.autoscale`).
        init_fn: ``f(worker_index, worker_count)`` run in each worker before work.
        worker_kind: ``"processes"``, ``"threads"`` or ``"auto"`` (threads measured,
            processes where the units hold the GIL: :mod:`~.autoscale.kind`).
        warm_start: compute the units asked for in this process while no worker is ready
            (an opt-in that runs user code in the training process; not with
            ``unit_timeout_s``: a unit computed here cannot be timed out).
        stall_warning_s: log a unit that a worker has computed for this long (None:
            never).
        unit_timeout_s: make a unit computed for this long an error and replace its
            worker (None: never).
        make_workers: ``f(slots)`` -> the :class:`Workers` (tests pass a fake that
            starts nothing; a ``RayExecutor`` its actors); None: the kind's
            (:func:`~.autoscale.kind.worker_sets`).
        scaling: what decides the worker count as the pool runs, for a fixed
            ``worker_count`` (a ``RayExecutor`` follows its ``scale(n)``); None: fixed.
    """

    def __init__(
        self,
        plan: Plan,
        plan_bytes: bytes,
        position: int,
        *,
        worker_count: int | AutoWorkers,
        buffer_size: int,
        init_fn: Any = None,
        worker_kind: str = "processes",
        warm_start: bool = False,
        stall_warning_s: float | None = None,
        unit_timeout_s: float | None = None,
        make_workers: Callable[[int], Workers] | None = None,
        scaling: Decider | None = None,
    ) -> None:
        self._plan = plan
        self._warm_start = warm_start and unit_timeout_s is None
        self._scaling: Decider | None = scaling
        if isinstance(worker_count, AutoWorkers):
            self._scaling = Scaling(worker_count, buffer_size)
            # Slots (progress board, worker indices) for the most workers there may be.
            self._worker_count, self._initial = self._scaling.high, self._scaling.initial
        else:
            self._worker_count = self._initial = worker_count
        self._make_workers = make_workers or worker_sets(worker_kind, plan, plan_bytes, init_fn, self._initial)
        self._buffer = buffer_size
        self.worker_counts: list[tuple[float, int]] = []  # (time.monotonic(), count) at each change
        self._window = Window(self._initial * buffer_size, buffer_size)
        self._watch = StallWatch(plan, stall_warning_s, unit_timeout_s)
        self._oom = OomWatch()  # before any worker starts: kills counted from here on
        super().__init__()
        self._start()
        self._window.reset(plan.units(position))
        self._start_early()

    def _start(self) -> None:
        self._closing = False
        self._handing_over = 0  # workers to start once the threads are done (auto kind)
        self._next_check = 0.0  # when to look for stuck workers next (time.monotonic)
        self._own(self._make_workers(self._worker_count))
        self._window.clear_workers()
        self._ever_ready = False
        self._joined(self._workers.start(self._initial, spare_a_core=self._warm_start))
        self.worker_counts.append((time.monotonic(), self._initial))

    def _joined(self, started: Iterable[Any]) -> None:
        """Gives each worker just started room in the window, and fits the window to
        ``buffer_size`` units per worker that takes units (deferred ones too)."""
        for w in started:
            self._window.add_worker(w.key)
        self._window.size = (len(self._workers.live()) + len(self._workers.deferred)) * self._buffer

    def _blocks_needed(self) -> int:
        return self._window.size + len(self._workers.workers) + 2

    def reset(self, position: int) -> None:
        """Starts a new stream at ``position``, dropping the old one's results. The workers
        stay up (a restore costs no process start-up) unless an error stopped them."""
        with self._lock:
            if not self._finalizer.alive:
                self._start()
            self._window.reset(self._plan.units(position))

    # -- consuming ------------------------------------------------------------------------

    def _next_locked(self) -> UnitResult:
        window = self._window
        while True:
            # Stuck workers are looked for on every call (one clock read; a look every
            # `interval` s), not only while waiting, so a unit stuck behind the head is
            # found while the training step runs.
            now = time.monotonic()
            if now >= self._next_check:
                self._next_check = now + self._watch.interval
                self._check_stalls()
            if self._scaling is not None:
                self._autoscale(self._scaling, now)
            if self._workers.handover is not None:
                self._hand_over()
            outcome = window.take_head()
            if outcome is not None:
                if outcome.error is not None:
                    self._finalizer()  # an error ends the stream; every child is stopped (lock held)
                    raise outcome.error
                # Keep the workers fed while the consumer eats what is buffered: take in
                # the answers already there and hand out the room just freed (else the
                # room waits for the next call that finds the head missing, and the
                # consumer of a slow training step waits for a unit sent too late).
                self._wait(0)
                self._dispatch()
                return outcome.value
            if window.finished:
                raise StopIteration
            if self._closing:
                raise self._closed_error()
            self._dispatch()
            # Nothing is dispatched before a worker is ready, so the head unit is free.
            # With the opt-in, units computed here until then fill the start-up gap (a
            # record that crashes its process takes this one down: hence not by default).
            if self._warm_start and not self._ever_ready:
                self._wait(0)  # a worker ready by now takes the head instead
                if not self._ever_ready:
                    self._compute_inline(window.head)
                continue
            started = time.monotonic()
            self._wait(self._watch.interval)
            if self._scaling is not None:
                self._scaling.waited(time.monotonic() - started)

    def _compute_inline(self, unit: int) -> None:
        try:
            if unit >= self._window.created and self._window.next_unit() is None:
                return
            try:
                result = compute_unit(self._plan, *self._window.range(unit))
            except PipelineError as exc:
                self._window.finish(unit, Outcome(None, exc))
                return
            self._window.finish(unit, Outcome(result))
            self._workers.note_local_result(result, self._blocks_needed())
        finally:
            self._joined(self._workers.start_deferred())

    # -- dispatching and receiving --------------------------------------------------------

    def _dispatch(self) -> None:
        window, workers = self._window, self._workers
        ready = {w.key: w for w in workers.workers if w.ready and not w.retiring}
        while ready:
            key = window.pick_worker(ready)
            if key is None:
                return
            unit = window.next_unit()
            if unit is None:
                return
            start, stop = window.range(unit)
            try:
                token = workers.send(ready[key], window.generation, unit, start, stop, self._blocks_needed())
            except OSError:
                window.give_back(unit)
                return  # the worker is dying; _wait will notice and replace it
            window.sent(key, unit, token)

    def _wait(self, timeout: float) -> None:
        """Handles every message that arrives within ``timeout`` seconds (0: only ready ones)."""
        for w, message, nbytes in self._workers.events(timeout):
            if message is None:
                self._replace(w)
            else:
                self._receive(w, message, nbytes)

    def _receive(self, w: Any, message: Any, nbytes: int) -> None:
        if isinstance(message, Ready):
            w.ready = self._ever_ready = True
            self._joined(self._workers.start_deferred())
            return
        if isinstance(message, Fatal):
            self._finalizer()  # lock held: not close()
            raise WorkerError(f"worker {w.index} could not start:\n{message.traceback}")
        assert isinstance(message, (Done, Failed)), message
        window, workers = self._window, self._workers
        entry = window.answered(w.key, message.generation, message.unit)
        if entry.generation != window.generation:
            workers.give_back(entry.token)
            return
        if isinstance(message, Failed):
            workers.give_back(entry.token)
            window.finish(entry.unit, Outcome(None, workers.error(w, message.error)))
            return
        window.finish(entry.unit, Outcome(workers.result(w, entry.token, message, nbytes, self._blocks_needed())))
        if workers.deferred:  # threads that start once a trial's first thread is done
            self._joined(workers.start_deferred())
        if w.retiring and not window.held(w.key):
            self._stop_retired(w)

    # -- deaths, stalls and worker_count="auto" ---------------------------------------------

    def _check_stalls(self) -> None:
        workers = self._workers
        if workers.board is not None:
            self._wait(0)  # answers already in the pipes first: their units are not stuck
            for stuck in self._watch.check(workers, self._window):
                workers.kill(stuck.worker)
                self._replace(stuck.worker, stuck)

    def _replace(self, w: Any, stuck: Stuck | None = None) -> None:
        """A worker died, or was killed for taking too long (``stuck``): forget it, start
        another, and compute its units again (all but the one it was stuck on, which
        becomes ``stuck.error``)."""
        if not self._finalizer.alive:
            return  # the pool was closed: its pipes are closed, nobody died
        try:
            code = self._workers.bury(w, timed_out=stuck is not None)
        except WorkerError:
            self._finalizer()  # lock held: not close()
            raise
        errors: list[tuple[int, WorkerError]]
        if stuck is not None and not self._workers.retries_stuck:
            tokens, unit = self._window.worker_timed_out(w.key)
            errors = [(unit, stuck.error)] if unit is not None and stuck.error is not None else []
        else:  # died, or timed out where another worker may well succeed (a Ray actor)
            tokens, poisoned = self._window.worker_died(w.key, MAX_CRASHES)
            if stuck is not None:
                errors = [(u, stuck.error) for u in poisoned if stuck.error is not None]
            else:
                oom = self._oom.report(w.index, w.pid, code, len(self._workers.live()), self._workers.worker_bytes())
                errors = [(u, crash_error(self._plan, self._window.range(u), code, MAX_CRASHES, oom)) for u in poisoned]
        for token in tokens:
            self._workers.give_back(token)
        for unit, error in errors:
            self._window.finish(unit, Outcome(None, error))
        self._joined(self._workers.replace(w))  # none if it was leaving anyway

    def describe(self) -> dict[str, Any]:
        """What ``stats()["pipeline"]["workers"]`` says: the kind and how it was chosen."""
        return self._workers.describe()
