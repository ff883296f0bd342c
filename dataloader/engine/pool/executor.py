"""The worker pool as an executor: unit results in unit order, computed by child processes.

Three parts, each in its own module, are put together here:

* :mod:`~dataloader.engine.pool.process`: starting and stopping the children;
* :mod:`~dataloader.engine.pool.window`: which unit goes to which worker, and what the
  consumer gets next (at most ``buffer_size`` units per worker, never more than
  ``worker_count * buffer_size`` units ahead of the consumer, which bounds memory);
* :mod:`~dataloader.engine.pool.transport`: results back through shared memory.

Until a worker is ready, the parent computes the units the consumer asks for itself, so
the first batches cost what they cost in-process rather than a process start-up and
the consumer is not left waiting while the workers start (``warm_start``; a record
that crashes its process would crash the parent there, so it can be switched off).
A thread hands out the first units as soon as workers are ready, before the first
``next()``, so the pool works while the training script still sets up.

A worker that dies (SIGKILL, OOM killer, segfault) closes its result pipe, which wakes
the parent at once: it is replaced and its units are computed again, so the output is
unchanged. A unit that killed its worker ``MAX_CRASHES`` times becomes an error at its
place in the stream. Exceptions, whatever their type (``SystemExit`` included), are not
deaths: they come back as the unit's error (see :mod:`~dataloader.engine.compute`).

Workers report where they are in a shared progress board
(:mod:`~dataloader.engine.pool.progress`); while the consumer waits, the pool warns
about units past ``stall_warning_s`` and kills workers past ``unit_timeout_s``
(:mod:`~dataloader.engine.pool.stalls`).

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
import os
import pickle
import select
import subprocess
import threading
import time
import weakref
from multiprocessing.connection import wait
from typing import Any

import cloudpickle

from dataloader.engine.compute import UnitResult, compute_unit, unit_record_keys
from dataloader.engine.plan import Plan
from dataloader.engine.pool import autoscale
from dataloader.engine.pool import zygote as fork_server
from dataloader.engine.pool.messages import (
    Done,
    Failed,
    Fatal,
    Init,
    Ready,
    Task,
    WorkerConfig,
    remote_error,
)
from dataloader.engine.pool.process import WorkerProcess
from dataloader.engine.pool.shm import shm_free_bytes
from dataloader.engine.pool.stalls import StallWatch, Stuck
from dataloader.engine.pool.window import Outcome, Window
from dataloader.engine.pool.workers import _release, _Resources
from dataloader.errors import (
    LoaderClosedError,
    PipelineError,
    WorkerCrashError,
    WorkerError,
)
from dataloader.options import AutoWorkers

MAX_CRASHES = 3
CLOSE_WAIT_S = 1.0  # how long close() waits for a next() in progress to give way

logger = logging.getLogger("dataloader")


def _still_wanted(ref: weakref.ref[PoolExecutor]) -> PoolExecutor | None:
    """The executor, while the start-up thread still has work: not collected, not
    closed, and the consumer has not started (call with nothing locked)."""
    executor = ref()
    if executor is None:
        return None
    with executor._lock:
        if executor._consumer_started or executor._closing or not executor._finalizer.alive:
            return None
    return executor


def _prestart(ref: weakref.ref[PoolExecutor]) -> None:
    """Hands out the first units as soon as workers are ready, before the first ``next()``.

    So the pool works while the training script is still setting up (compiling its
    step, restoring a checkpoint). Ends when the consumer starts, or the executor is
    closed or collected (it holds only a weak reference between rounds).
    """
    while True:
        executor = _still_wanted(ref)
        if executor is None:
            return
        conns = [w.results for w in executor._res.workers]
        del executor
        with contextlib.suppress(OSError, ValueError):  # a pipe closed under us
            wait(conns, 0.05)
        executor = _still_wanted(ref)
        if executor is None:
            return
        with executor._lock:
            # Checked again under the lock: the consumer may have started, or the pool
            # been closed (then its pipes are closed and must not look like dead workers).
            if executor._consumer_started or executor._closing or not executor._finalizer.alive:
                return
            try:
                executor._wait(0)
                executor._dispatch()
            except Exception as exc:  # e.g. a worker that cannot start
                executor._prestart_error = exc
                return
        del executor


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
    ) -> None:
        self._plan = plan
        self._plan_bytes = plan_bytes
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
        self._closing = False
        self._consumer_started = False
        self._prestart_error: Exception | None = None
        self._start()
        self._window.reset(plan.units(position))
        threading.Thread(
            target=_prestart, args=(weakref.ref(self),), name="granary-prestart", daemon=True
        ).start()

    # -- set-up ---------------------------------------------------------------------------

    def _start(self) -> None:
        self._closing = False
        self._next_check = 0.0  # when to look for stuck workers next (time.monotonic)
        self._res = _Resources(self._worker_count, self._plan_bytes)
        self._window.clear_workers()
        self._finalizer = weakref.finalize(self, _release, self._res)
        self._ever_ready = False
        self._startup_deaths = 0
        # One poll object for the life of the pool: building a selector per wait (as
        # multiprocessing.connection.wait does) cost ~70 us of parent CPU per batch.
        self._poller = select.poll()
        self._by_fd: dict[int, WorkerProcess] = {}
        # Start-up must not slow the first batch. Forked workers cost next to nothing
        # (the fork server imports once, off the parent's CPU): all are asked for at
        # once. Without a fork server, while the parent computes warm-start units, start
        # only as many workers as leave it a core of its own (their imports take ~0.3 s
        # of CPU each); the rest start once the first warm unit is done or a worker is ready.
        now = self._initial
        if self._warm_start and self._res.zygote is None:
            now = max(1, min(now, autoscale.usable_cpus() - 1))
        self._res.workers = [self._spawn(i) for i in range(now)]
        self._deferred = list(range(now, self._initial))
        self._fit_window()
        self.worker_counts.append((time.monotonic(), self._initial))
        self._worker_bytes = 0  # private memory of one worker, measured once one is ready

    def _fit_window(self) -> None:
        """``buffer_size`` units in flight for each worker that takes units (those still
        to start included, retiring ones not)."""
        takers = sum(1 for w in self._res.workers if not w.retiring) + len(self._deferred)
        self._window.size = takers * self._buffer

    def _spawn_deferred(self) -> None:
        while self._deferred and not self._closing:
            self._res.workers.append(self._spawn(self._deferred.pop(0)))

    def _spawn(self, index: int) -> WorkerProcess:
        if self._closing:  # close() released the pool while this thread was busy
            raise self._closed_error()
        board = self._res.board
        if board is not None:
            board.clear(index)  # what the slot's previous worker wrote is not the new one's
        config = WorkerConfig(
            parent_pid=os.getpid(),
            plan=self._plan_bytes,
            init_fn=self._init_fn,
            worker_index=index,
            worker_count=self._worker_count,
            cpus=tuple(sorted(os.sched_getaffinity(0))),
            block_prefix=self._res.transport.prefix,
            progress_fd=board.fd if board is not None else -1,
        )
        shared = (board.fd,) if board is not None else ()
        init = pickle.dumps(Init(config))
        zygote = self._res.zygote
        worker = None
        if zygote is not None:
            with contextlib.suppress(OSError):  # the fork server is gone: start one as before
                worker = WorkerProcess(index, init, shared, zygote)
            if worker is None:
                self._drop_zygote()
        if worker is None:
            worker = WorkerProcess(index, init, shared)
        fd = worker.results.fileno()
        self._by_fd[fd] = worker
        self._poller.register(fd, select.POLLIN)
        self._window.add_worker(worker.key)
        return worker

    def _blocks_needed(self) -> int:
        return self._window.size + len(self._res.workers) + 2

    def reset(self, position: int) -> None:
        """Starts a new stream at ``position``; results of the old one are discarded.

        The workers stay up (a restore costs no process start-up), unless an error had
        stopped them, in which case a fresh pool starts.
        """
        with self._lock:
            if not self._finalizer.alive:
                self._start()
            self._window.reset(self._plan.units(position))

    # -- consuming ------------------------------------------------------------------------

    def __iter__(self) -> PoolExecutor:
        return self

    def __next__(self) -> UnitResult:
        with self._lock:
            self._consumer_started = True
            if self._prestart_error is not None:
                error, self._prestart_error = self._prestart_error, None
                raise error
            if not self._finalizer.alive:
                raise StopIteration
            try:
                return self._next_locked()
            except (OSError, ValueError) as exc:  # pipes or blocks closed under a busy call
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
            if self._scaler is None:
                self._wait(self._watch.interval)
            else:
                started = time.monotonic()
                self._wait(self._watch.interval)
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
            self._res.transport.note_local_result(result, self._blocks_needed())
        finally:
            self._spawn_deferred()

    # -- dispatching ----------------------------------------------------------------------

    def _dispatch(self) -> None:
        window, transport = self._window, self._res.transport
        ready = {w.key: w for w in self._res.workers if w.ready and not w.retiring}
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

    # -- receiving ------------------------------------------------------------------------

    def _wait(self, timeout: float) -> None:
        """Handles every message that arrives within ``timeout`` seconds (0: only ready ones)."""
        for fd, _ in self._poller.poll(int(timeout * 1000)):
            w = self._by_fd.get(fd)
            if w is None:
                continue  # replaced while this batch of events was handled
            try:
                message, nbytes = w.receive()
            except (EOFError, OSError):
                self._replace(w)
                continue
            self._receive(w, message, nbytes)

    def _receive(self, w: WorkerProcess, message: Any, nbytes: int) -> None:
        if isinstance(message, Ready):
            w.ready = self._ever_ready = True
            self._spawn_deferred()
            return
        if isinstance(message, Fatal):
            self._finalizer()  # lock held: not close()
            raise WorkerError(f"worker {w.index} could not start:\n{message.traceback}")
        assert isinstance(message, (Done, Failed)), message
        window, transport = self._window, self._res.transport
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

    def _check_stalls(self) -> None:
        board = self._res.board
        if board is None:
            return
        self._wait(0)  # answers already in the pipes first: their units are not stuck
        for stuck in self._watch.check(self._res.workers, self._window, board):
            stuck.worker.proc.kill()
            self._replace(stuck.worker, stuck)

    def _replace(self, w: WorkerProcess, stuck: Stuck | None = None) -> None:
        """A worker died, or was killed for taking too long (``stuck``): reap it, start
        another, and compute its units again (all but the one it was stuck on, which
        becomes ``stuck.error``)."""
        if not self._finalizer.alive:
            return  # the pool was closed: its pipes are closed, nobody died
        code = w.reap()
        fd = w.results.fileno()
        self._poller.unregister(fd)
        del self._by_fd[fd]
        w.close_pipes()
        if isinstance(w.proc, fork_server.ForkedChild) and (w.proc.lost or code == fork_server.LOST):
            # The fork server refused or died: not the pipeline's fault; start
            # interpreters from now on.
            self._drop_zygote()
        elif stuck is None and not w.ready:
            self._startup_deaths += 1
            if self._startup_deaths >= MAX_CRASHES:
                self._finalizer()  # lock held: not close()
                raise WorkerError(
                    f"worker processes keep dying before they start (exit code {code}); "
                    f"run with worker_count=0 to see the error in this process"
                )
        errors: list[tuple[int, WorkerError]] = []
        if stuck is not None:
            tokens, unit = self._window.worker_timed_out(w.key)
            if unit is not None and stuck.error is not None:
                errors.append((unit, stuck.error))
        else:
            tokens, poisoned = self._window.worker_died(w.key, MAX_CRASHES)
            errors += [(unit, self._crash_error(unit, code)) for unit in poisoned]
        for token in tokens:
            self._res.transport.give_back(token)
        for unit, error in errors:
            self._window.finish(unit, Outcome(None, error))
        i = self._res.workers.index(w)
        if w.retiring:  # it was leaving anyway: its units went back to the others
            del self._res.workers[i]
            return
        self._res.workers[i] = self._spawn(w.index)

    # -- worker_count="auto" ---------------------------------------------------------------

    def _autoscale(self, now: float) -> None:
        """Samples the idle workers and, once per interval, adds or retires some."""
        scaler, window = self._scaler, self._window
        assert scaler is not None
        live = [w for w in self._res.workers if not w.retiring]
        starting = bool(self._deferred) or not all(w.ready for w in live)
        if not window.exhausted:
            scaler.sample(sum(1 for w in live if w.ready and not window.held(w.key)))
        change = scaler.decide(now, len(live), starting, lambda: self._room(live))
        if change > 0:
            self._add_workers(change)
        elif change < 0:
            self._retire_workers(live, -change)
        if change:
            self.worker_counts.append((now, len(live) + change))
            logger.info("granary: worker_count auto: %d -> %d workers", len(live), len(live) + change)
        self._reap_retired()

    def _room(self, live: list[WorkerProcess]) -> int:
        assert self._scaler is not None
        if not self._worker_bytes and live and live[0].ready:
            self._worker_bytes = autoscale.private_bytes(live[0].pid)
        transport = self._res.transport
        use_shm = transport.use_shm
        return autoscale.room(
            self._auto,
            self._worker_bytes,
            self._buffer + 1,
            transport.blocks.target_size if use_shm else 0,
            shm_free_bytes() if use_shm else None,
        )

    def _add_workers(self, count: int) -> None:
        used = {w.index for w in self._res.workers}
        free = [i for i in range(self._worker_count) if i not in used]
        for index in free[:count]:
            self._res.workers.append(self._spawn(index))
        self._fit_window()

    def _retire_workers(self, live: list[WorkerProcess], count: int) -> None:
        """Stops giving ``count`` workers units (the highest indices); each stops once
        it has answered what it holds."""
        for w in sorted(live, key=lambda w: -w.index)[:count]:
            w.retiring = True
            if not self._window.held(w.key):
                self._stop_retired(w)
        self._fit_window()

    def _stop_retired(self, w: WorkerProcess) -> None:
        """A retiring worker holds no unit: close its task pipe (it exits) and forget it;
        it is reaped later (:meth:`_reap_retired`) so that this call does not wait."""
        fd = w.results.fileno()
        self._poller.unregister(fd)
        del self._by_fd[fd]
        self._window.remove_worker(w.key)
        self._res.workers.remove(w)
        with contextlib.suppress(OSError):
            w.tasks.close()
        self._res.retired.append(w)

    def _reap_retired(self) -> None:
        for w in list(self._res.retired):
            try:
                w.proc.wait(0)
            except subprocess.TimeoutExpired:  # still exiting: next time
                continue
            w.close_pipes()
            self._res.retired.remove(w)

    def _drop_zygote(self) -> None:
        if self._res.zygote is not None:
            self._res.zygote.close()
            self._res.zygote = None

    def _crash_error(self, unit: int, code: int) -> WorkerCrashError:
        start, stop = self._window.range(unit)
        keys = unit_record_keys(self._plan, start, stop).tolist()
        how = f"signal {-code}" if code < 0 else f"exit code {code}"
        return WorkerCrashError(
            f"the unit of positions [{start}, {stop}) killed its worker {MAX_CRASHES} times "
            f"(last: {how}); it reads record indices {keys}; find the record that crashes "
            f"(e.g. with worker_count=0 under a debugger) and filter or repair it"
        )

    # -- shutting down --------------------------------------------------------------------

    @property
    def pids(self) -> list[int]:
        return [w.pid for w in self._res.workers]

    def close(self) -> None:
        """Stops every worker and unlinks every block, from any thread, in bounded time.

        A ``next()`` waiting in another thread raises
        :class:`~dataloader.errors.LoaderClosedError` within a fraction of a second and
        gives way; one busy in user code in this process is not waited for beyond
        ``CLOSE_WAIT_S`` (the workers are stopped under it).
        """
        self._closing = True
        locked = self._lock.acquire(timeout=CLOSE_WAIT_S)
        try:
            self._finalizer()
        finally:
            if locked:
                self._lock.release()
