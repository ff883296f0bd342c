"""The worker pool as an executor: unit results in unit order, computed by child processes.

This is the scheduling loop. It works over three parts, each in its own module:

* :mod:`~dataloader.engine.pool.window`: which unit goes to which worker, and what the
  consumer gets next (at most ``buffer_size`` units per worker, never more than
  ``worker_count * buffer_size`` units ahead of the consumer, which bounds memory);
* :mod:`~dataloader.engine.pool.transport`: results back through shared memory;
* :mod:`~dataloader.engine.pool.workers`: the processes (started, replaced, retired,
  reaped), reached through :class:`Workers`, so the loop is tested with a fake.

Until a worker is ready, the parent computes the units the consumer asks for itself
(``warm_start``; a record that crashes its process would crash the parent there, so
it can be switched off). A thread hands out the first units as soon as workers are
ready, before the first ``next()``, so the pool works while the training script sets up.

A worker that dies (SIGKILL, OOM killer, segfault) closes its result pipe, which wakes
the parent at once: it is replaced and its units are computed again, so the output is
unchanged. A unit that killed its worker ``MAX_CRASHES`` times becomes an error at its
place in the stream. Exceptions, whatever their type (``SystemExit`` included), are not
deaths: they come back as the unit's error (see :mod:`~dataloader.engine.compute`).
While the consumer waits, the pool warns about units past ``stall_warning_s`` and kills
workers past ``unit_timeout_s`` (:mod:`~dataloader.engine.pool.watch.stalls`).

Threads. Calls are serialised by a lock, but ``close()`` never waits on a stuck
``next()``: the consumer polls in steps of at most 0.25 s and gives the lock up, with a
:class:`~dataloader.errors.LoaderClosedError`, once it sees that ``close()`` was
called. Only a ``next()`` busy in user code in this process (a warm-start unit)
cannot give it up; ``close()`` then releases the workers and blocks without it, after
``CLOSE_WAIT_S``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import cloudpickle

from dataloader.engine.compute import UnitResult, compute_unit
from dataloader.engine.plan import Plan
from dataloader.engine.pool import autoscale
from dataloader.engine.pool.autoscale.measure import decide
from dataloader.engine.pool.messages import Done, Failed, Fatal, Ready, Task, remote_error
from dataloader.engine.pool.process import WorkerProcess
from dataloader.engine.pool.transport import Transport
from dataloader.engine.pool.watch.stalls import StallWatch, Stuck, crash_error
from dataloader.engine.pool.window import Outcome, Window
from dataloader.engine.pool.workers import MAX_CRASHES, Closing, Workers, WorkerSet
from dataloader.errors import LoaderClosedError, PipelineError, WorkerError
from dataloader.options import AutoWorkers

CLOSE_WAIT_S = 1.0  # how long close() waits for a next() in progress to give way

logger = logging.getLogger("dataloader")


def _release(workers: Workers, transport: Transport) -> None:
    """Stops every child within a bounded time and unlinks every block."""
    workers.close()
    transport.close()


class PoolExecutor:
    """Unit results in order, computed by a pool of worker processes.

    Implements :class:`~dataloader.engine.executor.Executor`.

    Args:
        plan: the pipeline's plan; ``plan_bytes`` its pickled form (made once, at
            loader construction, so an unpicklable operation fails early).
        position: the local position to start from.
        worker_count, buffer_size: processes, and units in flight per process. An
            :class:`~dataloader.options.AutoWorkers`: the count changes as the pool
            runs (:mod:`~dataloader.engine.pool.autoscale`).
        init_fn: ``f(worker_index, worker_count)`` run in each child before work.
        warm_start: compute the units asked for in this process while no worker is ready
            (not with ``unit_timeout_s``: a unit computed here cannot be timed out).
        stall_warning_s: log a unit that a worker has computed for this long (None:
            never).
        unit_timeout_s: make a unit computed for this long an error and replace its
            worker (None: never).
        make_workers: ``f(slots, plan_bytes, init_fn bytes, block_prefix)`` -> the
            :class:`Workers` (tests pass a fake that starts no process).
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
        warm_start: bool = True,
        stall_warning_s: float | None = None,
        unit_timeout_s: float | None = None,
        make_workers: Callable[[int, bytes, bytes, str], Workers] = WorkerSet,
    ) -> None:
        self._plan, self._plan_bytes, self._make_workers = plan, plan_bytes, make_workers
        self._init_fn = cloudpickle.dumps(init_fn)
        self._warm_start = warm_start and unit_timeout_s is None
        self._scaler: autoscale.Scaler | None = None
        if isinstance(worker_count, AutoWorkers):
            self._auto = worker_count
            self._scaler = autoscale.Scaler(worker_count, autoscale.usable_cpus(), time.monotonic())
            # Slots (progress board, worker indices) for the most workers there may be.
            self._worker_count, self._initial = self._scaler.high, self._scaler.initial
        else:
            self._worker_count = self._initial = worker_count
        self._buffer = buffer_size
        self.worker_counts: list[tuple[float, int]] = []  # (time.monotonic(), count) at each change
        self._window = Window(self._initial * buffer_size, buffer_size)
        self._watch = StallWatch(plan, stall_warning_s, unit_timeout_s)
        self._lock = threading.Lock()
        self._consumer_started = False
        self._prestart_error: Exception | None = None
        self._start()
        self._window.reset(plan.units(position))
        threading.Thread(
            target=PoolExecutor._prestart, args=(weakref.ref(self),), name="granary-prestart", daemon=True
        ).start()

    def _start(self) -> None:
        self._closing = False
        self._next_check = 0.0  # when to look for stuck workers next (time.monotonic)
        self._transport = Transport()
        self._workers = self._make_workers(
            self._worker_count, self._plan_bytes, self._init_fn, self._transport.prefix
        )
        self._window.clear_workers()
        self._finalizer = weakref.finalize(self, _release, self._workers, self._transport)
        self._ever_ready = False
        self._joined(self._workers.start(self._initial, spare_a_core=self._warm_start))
        self.worker_counts.append((time.monotonic(), self._initial))

    def _joined(self, started: Iterable[WorkerProcess]) -> None:
        """Gives each worker just started room in the window, then fits the window to
        ``buffer_size`` units for each worker that takes units (those still to start
        included, retiring ones not)."""
        for w in started:
            self._window.add_worker(w.key)
        self._window.size = (len(self._workers.live()) + len(self._workers.deferred)) * self._buffer

    def _blocks_needed(self) -> int:
        return self._window.size + len(self._workers.workers) + 2

    def reset(self, position: int) -> None:
        """Starts a new stream at ``position``; results of the old one are discarded.

        The workers stay up (a restore costs no process start-up), unless an error had
        stopped them, in which case a fresh pool starts.
        """
        with self._lock:
            if not self._finalizer.alive:
                self._start()
            self._window.reset(self._plan.units(position))

    @staticmethod
    def _prestart(ref: weakref.ref[PoolExecutor]) -> None:
        """Hands out the first units as soon as workers are ready, before the first
        ``next()``, so the pool works while the training script is still setting up.
        Ends when the consumer starts, or the executor is closed or collected (it holds
        only a weak reference between rounds, and no lock while it waits)."""
        while True:
            executor = ref()
            if executor is None or not executor._wanted_early(locked=False):
                return
            workers = executor._workers
            del executor
            workers.wait_readable(0.05)
            executor = ref()
            if executor is None:
                return
            with executor._lock:
                # Checked again under the lock: the consumer may have started, or the pool
                # been closed (then its pipes are closed and must not look like dead workers).
                if not executor._wanted_early(locked=True):
                    return
                try:
                    executor._wait(0)
                    executor._dispatch()
                except Exception as exc:  # e.g. a worker that cannot start
                    executor._prestart_error = exc
                    return
            del executor

    def _wanted_early(self, locked: bool) -> bool:
        with contextlib.nullcontext() if locked else self._lock:
            return not (self._consumer_started or self._closing or not self._finalizer.alive)

    # -- consuming ------------------------------------------------------------------------

    def __iter__(self) -> PoolExecutor:
        return self

    def __next__(self) -> UnitResult:
        with self._lock:
            self._consumer_started = True
            if self._prestart_error is not None:
                error, self._prestart_error = self._prestart_error, None
                raise self._closed_error() if isinstance(error, Closing) else error
            if not self._finalizer.alive:
                raise StopIteration
            try:
                return self._next_locked()
            except (OSError, ValueError, Closing) as exc:  # closed under a busy call
                if self._closing:
                    raise self._closed_error() from exc
                raise

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
            if self._scaler is not None:
                self._autoscale(now)
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
            # Units computed here until then fill the start-up gap (a record that crashes
            # its process would take this one down: hence warm_start=False).
            if self._warm_start and not self._ever_ready:
                self._wait(0)  # a worker ready by now takes the head instead
                if not self._ever_ready:
                    self._compute_inline(window.head)
                continue
            started = time.monotonic()
            self._wait(self._watch.interval)
            if self._scaler is not None:
                self._scaler.waited(time.monotonic() - started)

    def _closed_error(self) -> LoaderClosedError:
        return LoaderClosedError(
            f"the loader was closed while next() waited for unit {self._window.head}; "
            f"this iterator is finished: make a new one (or set_state) to go on"
        )

    def _compute_inline(self, unit: int) -> None:
        try:
            if unit >= self._window.created and self._window.next_unit() is None:
                return
            start, stop = self._window.range(unit)
            try:
                result = compute_unit(self._plan, start, stop)
            except PipelineError as exc:
                self._window.finish(unit, Outcome(None, exc))
                return
            self._window.finish(unit, Outcome(result))
            self._transport.note_local_result(result, self._blocks_needed())
        finally:
            self._joined(self._workers.start_deferred())

    # -- dispatching and receiving --------------------------------------------------------

    def _dispatch(self) -> None:
        window, transport = self._window, self._transport
        ready = {w.key: w for w in self._workers.workers if w.ready and not w.retiring}
        while ready:
            key = window.pick_worker(ready)
            if key is None:
                return
            unit = window.next_unit()
            if unit is None:
                return
            block, forget = transport.lend(key)
            start, stop = window.range(unit)
            name = block.name if block is not None else None
            task = Task(window.generation, unit, start, stop, name, forget)
            try:
                ready[key].send(task)
            except OSError:
                transport.give_back(block)
                window.give_back(unit)
                return  # the worker is dying; _wait will notice and replace it
            window.sent(key, unit, block)

    def _wait(self, timeout: float) -> None:
        """Handles every message that arrives within ``timeout`` seconds (0: only ready ones)."""
        for w, message, nbytes in self._workers.events(timeout):
            if message is None:
                self._replace(w)
            else:
                self._receive(w, message, nbytes)

    def _receive(self, w: WorkerProcess, message: Any, nbytes: int) -> None:
        if isinstance(message, Ready):
            w.ready = self._ever_ready = True
            self._joined(self._workers.start_deferred())
            return
        if isinstance(message, Fatal):
            self._finalizer()  # lock held: not close()
            raise WorkerError(f"worker {w.index} could not start:\n{message.traceback}")
        assert isinstance(message, (Done, Failed)), message
        window, transport = self._window, self._transport
        entry = window.answered(w.key, message.generation, message.unit)
        if entry.generation != window.generation:
            transport.give_back(entry.token)
            return
        if isinstance(message, Failed):
            transport.give_back(entry.token)
            window.finish(entry.unit, Outcome(None, remote_error(message.error, w.index)))
            return
        began = time.perf_counter()
        value, size = transport.receive(entry.token, message, nbytes)
        # For stats(): who computed the unit, how it travelled, what receiving it cost.
        value.worker, value.piped = w.index, message.layout is None
        value.timings["transport"] = time.perf_counter() - began
        transport.note_size(size, self._blocks_needed())
        window.finish(entry.unit, Outcome(value))
        if w.retiring and not window.held(w.key):
            self._stop_retired(w)

    # -- deaths, stalls and worker_count="auto" ---------------------------------------------

    def _check_stalls(self) -> None:
        board = self._workers.board
        if board is None:
            return
        self._wait(0)  # answers already in the pipes first: their units are not stuck
        for stuck in self._watch.check(self._workers.workers, self._window, board):
            stuck.worker.proc.kill()
            self._replace(stuck.worker, stuck)

    def _replace(self, w: WorkerProcess, stuck: Stuck | None = None) -> None:
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
        errors: list[tuple[int, WorkerError]] = []
        if stuck is not None:
            tokens, unit = self._window.worker_timed_out(w.key)
            if unit is not None and stuck.error is not None:
                errors.append((unit, stuck.error))
        else:
            tokens, poisoned = self._window.worker_died(w.key, MAX_CRASHES)
            errors += [(u, crash_error(self._plan, self._window.range(u), code, MAX_CRASHES)) for u in poisoned]
        for token in tokens:
            self._transport.give_back(token)
        for unit, error in errors:
            self._window.finish(unit, Outcome(None, error))
        successor = self._workers.replace(w)  # None: it was leaving anyway
        self._joined([successor] if successor is not None else [])

    def _autoscale(self, now: float) -> None:
        """Adds or retires workers as the autoscaler decides (the highest indices retire,
        each once it has answered what it holds)."""
        workers, window = self._workers, self._window
        assert self._scaler is not None
        live = len(workers.live())
        change = decide(self._scaler, self._auto, now, workers, window, self._transport, self._buffer)
        if change > 0:
            self._joined(workers.add(change))
        elif change < 0:
            for w in workers.retire(-change):
                if not window.held(w.key):
                    self._stop_retired(w)
            self._joined([])
        if change:
            self.worker_counts.append((now, live + change))
            logger.info("granary: worker_count auto: %d -> %d workers", live, live + change)
        workers.reap_retired()

    def _stop_retired(self, w: WorkerProcess) -> None:
        self._window.remove_worker(w.key)
        self._workers.stop(w)

    # -- shutting down --------------------------------------------------------------------

    @property
    def pids(self) -> list[int]:
        return [w.pid for w in self._workers.workers]

    def close(self) -> None:
        """Stops every worker and unlinks every block, from any thread, in bounded time.

        A ``next()`` waiting in another thread raises
        :class:`~dataloader.errors.LoaderClosedError` within a fraction of a second and
        gives way; one busy in user code in this process is not waited for beyond
        ``CLOSE_WAIT_S`` (the workers are stopped under it).
        """
        self._closing = self._workers.stopping = True
        locked = self._lock.acquire(timeout=CLOSE_WAIT_S)
        try:
            self._finalizer()
        finally:
            if locked:
                self._lock.release()
