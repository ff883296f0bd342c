"""The worker pool: child processes computing units, results handed back in unit order.

Each worker is a ``python -m dataloader.engine.pool.worker`` child with two pipes of its own. The
parent keeps at most ``buffer_size`` units in flight per worker, gives the next unit to
whichever worker has room (so one slow unit does not stall the others) and never runs
more than ``worker_count * buffer_size`` units ahead of the consumer, which bounds
memory. Results come back through shared memory (:mod:`dataloader.engine.pool.shm`).

While no worker has started yet, the parent computes the first unit itself, so the first
batch costs what it costs in-process rather than a process start-up (``warm_start``;
only one unit, so a record that crashes its process can hurt the parent only there).

A worker that dies (SIGKILL, OOM killer, segfault) closes its result pipe, which wakes
the parent at once: it is replaced and its units are computed again, so the output is
unchanged. A unit that killed its worker ``MAX_CRASHES`` times becomes an error at its
place in the stream.
"""

from __future__ import annotations

import contextlib
import heapq
import json
import os
import pickle
import select
import subprocess
import sys
import threading
import time
import warnings
import weakref
from collections import deque
from multiprocessing.connection import Connection, wait
from typing import Any

import cloudpickle

from dataloader.engine.compute import UnitResult, compute_unit, record_index
from dataloader.engine.plan import Plan
from dataloader.engine.pool import shm
from dataloader.errors import PipelineError, WorkerCrashError, WorkerError

MAX_CRASHES = 3
STOP_GRACE_S = 2.0
# The folder that holds the ``dataloader`` package (site-packages, or the checkout).
_PACKAGE_HOME = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _startup_cpus() -> str:
    """CPUs a starting worker may use: all but the one this process runs on now.

    A new process tends to start on its parent's CPU and take it from the parent until
    the scheduler moves it; during start-up that is when the parent computes the first
    batch. The worker keeps off that CPU until it is ready, then takes them all back.
    Empty when there is no CPU to spare.
    """
    allowed = os.sched_getaffinity(0)
    try:
        with open("/proc/self/stat") as f:
            current = int(f.read().rsplit(")", 1)[1].split()[36])
    except (OSError, ValueError, IndexError):
        return ""
    spare = allowed - {current}
    return ",".join(map(str, sorted(spare))) if spare and current in allowed else ""


# Runs before anything is imported, so even the imports stay off the parent's CPU. The
# child takes the parent's sys.path before importing anything, so it resolves modules
# exactly as the parent does (a user's own ``operations.py`` stays theirs, and ours stay
# ``dataloader.operations``); the folder holding ``dataloader`` is a last resort.
_BOOT = (
    "import json, os, sys\n"
    "if sys.argv[3]: os.sched_setaffinity(0, {int(c) for c in sys.argv[3].split(',')})\n"
    "sys.path[:] = json.loads(os.environ.pop('GRANARY_SYS_PATH'))\n"
    "try:\n"
    "    from dataloader.engine.pool.worker import main\n"
    "except ImportError:\n"
    "    sys.path.append(os.environ['GRANARY_HOME'])\n"
    "    from dataloader.engine.pool.worker import main\n"
    "main(sys.argv)\n"
)


class Worker:
    """One child process and its pipes."""

    def __init__(self, index: int, init: bytes) -> None:
        self.index = index
        task_r, task_w = os.pipe()
        res_r, res_w = os.pipe()
        # Workers never touch accelerators; JAX, if a user operation imports it, stays on CPU.
        env = dict(
            os.environ,
            GRANARY_SYS_PATH=json.dumps(sys.path),
            GRANARY_HOME=_PACKAGE_HOME,
            JAX_PLATFORMS="cpu",
        )
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _BOOT, str(task_r), str(res_w), _startup_cpus()],
                pass_fds=(task_r, res_w),
                env=env,
                stdin=subprocess.DEVNULL,
            )
        finally:
            os.close(task_r)
            os.close(res_w)
        self.tasks = Connection(task_w, readable=False)
        self.results = Connection(res_r, writable=False)
        self.ready = False
        self.outstanding: deque[tuple[int, int, shm.Block | None]] = deque()
        self.forgotten = 0
        # The init message may exceed the pipe's buffer; a thread keeps the parent free
        # while the child starts up and reads it.
        threading.Thread(target=self._send_quietly, args=(init,), daemon=True).start()

    def _send_quietly(self, data: bytes) -> None:
        with contextlib.suppress(OSError):
            self.tasks.send_bytes(data)

    def send(self, message: tuple) -> None:
        self.tasks.send_bytes(pickle.dumps(message))

    def close_pipes(self) -> None:
        for conn in (self.tasks, self.results):
            with contextlib.suppress(OSError):
                conn.close()


class _Resources:
    """What must be released whatever happens: the processes and the blocks."""

    def __init__(self) -> None:
        self.workers: list[Worker] = []
        self.blocks = shm.BlockPool()


def _shutdown(res: _Resources) -> None:
    """Stops every child within a bounded time and unlinks every block."""
    # Closing a worker's task pipe is its signal to stop (EOF), whatever it was doing;
    # a message could race with the init message still being written by its thread.
    for w in res.workers:
        with contextlib.suppress(OSError):
            w.tasks.close()
    deadline = time.monotonic() + STOP_GRACE_S
    for w in res.workers:
        try:
            w.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            w.proc.terminate()
    for w in res.workers:
        try:
            w.proc.wait(1.0)
        except subprocess.TimeoutExpired:
            w.proc.kill()
            w.proc.wait()
        w.close_pipes()
    res.workers.clear()
    res.blocks.close()


def pickle_plan(plan: Plan) -> bytes:
    """The plan as sent to workers; names the part that cannot be pickled."""
    try:
        return cloudpickle.dumps(plan)
    except Exception as exc:
        parts = [("data_source", plan.source), ("sampler", plan.sampler)]
        parts += [(f"operation {s.op.name}", s.op) for s in (*plan.pre, *plan.post)]
        if plan.batch is not None:
            parts.append((plan.batch.name, plan.batch))
        for label, obj in parts:
            try:
                cloudpickle.dumps(obj)
            except Exception as part_exc:
                raise TypeError(
                    f"{label} ({obj!r}) cannot be sent to worker processes: "
                    f"{type(part_exc).__name__}: {part_exc}; make it picklable (open files "
                    f"and locks lazily) or use worker_count=0"
                ) from part_exc
        raise TypeError(f"the pipeline cannot be sent to worker processes: {exc}") from exc


def _remote_error(data: bytes, worker: int) -> Exception:
    """Rebuilds a worker's exception with the child's traceback in its message."""
    exc, cause, text = cloudpickle.loads(data)
    detail = f"\n\nTraceback in worker {worker}:\n{text}"
    if isinstance(exc, PipelineError):
        err: Exception = PipelineError(
            f"{exc}{detail}",
            operation=exc.operation,
            record_index=exc.record_index,
            position=exc.position,
        )
        err.__cause__ = cause
    else:
        err = WorkerError(f"worker {worker} failed: {type(exc).__name__}: {exc}{detail}")
        err.__cause__ = exc
    return err


def _still_wanted(ref: weakref.ref[PoolExecutor]) -> PoolExecutor | None:
    """The executor, while the start-up thread still has work: not collected, not
    closed, and the consumer has not started (call with nothing locked)."""
    executor = ref()
    if executor is None:
        return None
    with executor._lock:
        if executor._consumer_started or not executor._finalizer.alive:
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
            if executor._consumer_started or not executor._finalizer.alive:
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

    Args:
        plan: the pipeline's plan; ``plan_bytes`` its pickled form (made once, at
            loader construction, so an unpicklable operation fails early).
        position: the local position to start from.
        worker_count, buffer_size: processes, and units in flight per process.
        init_fn: ``f(worker_index, worker_count)`` run in each child before work.
        warm_start: compute the first unit in this process if no worker is ready yet.
    """

    def __init__(
        self,
        plan: Plan,
        plan_bytes: bytes,
        position: int,
        *,
        worker_count: int,
        buffer_size: int,
        init_fn: Any = None,
        warm_start: bool = True,
    ) -> None:
        self._plan = plan
        self._warm_start = warm_start
        self._buffer = buffer_size
        self._worker_count = worker_count
        self._window = worker_count * buffer_size
        self._use_shm = shm.shm_available()
        if not self._use_shm:
            self._warn(f"{shm.SHM_DIR} is not available")
        else:
            shm.sweep_stale_blocks()
        self._gen = 0
        self._init = {
            "parent_pid": os.getpid(),
            "plan": plan_bytes,
            "init_fn": cloudpickle.dumps(init_fn),
            "worker_count": worker_count,
            "cpus": sorted(os.sched_getaffinity(0)),
        }
        self._lock = threading.Lock()
        self._consumer_started = False
        self._prestart_error: Exception | None = None
        self._start()
        self._reset_locked(position)
        threading.Thread(
            target=_prestart, args=(weakref.ref(self),), name="granary-prestart", daemon=True
        ).start()

    # -- set-up ---------------------------------------------------------------------------

    def _start(self) -> None:
        self._res = _Resources()
        self._finalizer = weakref.finalize(self, _shutdown, self._res)
        self._ever_ready = False
        self._warm_pending = self._warm_start
        self._startup_deaths = 0
        # One poll object for the life of the pool: building a selector per wait (as
        # multiprocessing.connection.wait does) cost ~70 us of parent CPU per batch.
        self._poller = select.poll()
        self._by_fd: dict[int, Worker] = {}
        # Start-up must not slow the first batch: while the parent computes the warm
        # unit, start only as many workers as leave it a core of its own (their imports
        # take ~0.2 s of CPU each); the rest start once the warm unit is done or a worker
        # is ready. On a machine with cores to spare, every worker starts at once.
        now = self._worker_count
        if self._warm_pending:
            now = max(1, min(now, len(os.sched_getaffinity(0)) - 1))
        self._res.workers = [self._spawn(i) for i in range(now)]
        self._deferred = list(range(now, self._worker_count))

    def _spawn_deferred(self) -> None:
        while self._deferred:
            self._res.workers.append(self._spawn(self._deferred.pop(0)))

    def _spawn(self, index: int) -> Worker:
        config = {**self._init, "worker_index": index, "block_prefix": self._res.blocks.prefix}
        init = pickle.dumps(("init", pickle.dumps(config)))
        worker = Worker(index, init)
        fd = worker.results.fileno()
        self._by_fd[fd] = worker
        self._poller.register(fd, select.POLLIN)
        return worker

    def _warn(self, why: str) -> None:
        self._use_shm = False
        warnings.warn(
            f"granary: {why}, so results travel through pipes (slower, one more copy); "
            f"enlarge /dev/shm (e.g. docker --shm-size=2g) or lower worker_count or "
            f"worker_buffer_size",
            RuntimeWarning,
            stacklevel=4,
        )

    def reset(self, position: int) -> None:
        """Starts a new stream at ``position``; results of the old one are discarded.

        The workers stay up (a restore costs no process start-up), unless an error had
        stopped them, in which case a fresh pool starts.
        """
        with self._lock:
            if not self._finalizer.alive:
                self._start()
            self._reset_locked(position)

    def _reset_locked(self, position: int) -> None:
        self._gen += 1
        self._units = self._plan.units(position)
        self._ranges: dict[int, tuple[int, int]] = {}
        self._new = 0
        self._exhausted = False
        self._redo: list[int] = []
        self._done: dict[int, tuple[str, Any]] = {}
        self._head = 0
        self._crashes: dict[int, int] = {}

    # -- consuming ------------------------------------------------------------------------

    def __iter__(self) -> PoolExecutor:
        return self

    def __next__(self) -> UnitResult:
        with self._lock:
            self._consumer_started = True
            return self._next_locked()

    def _next_locked(self) -> UnitResult:
        if self._prestart_error is not None:
            error, self._prestart_error = self._prestart_error, None
            raise error
        if not self._finalizer.alive:
            raise StopIteration
        while True:
            item = self._done.pop(self._head, None)
            if item is not None:
                self._ranges.pop(self._head, None)
                self._head += 1
                kind, value = item
                if kind == "err":
                    self._finalizer()  # an error ends the stream; every child is stopped (lock held)
                    raise value
                return value
            if self._exhausted and self._head >= self._new and not self._redo:
                raise StopIteration
            self._dispatch()
            # Nothing is dispatched before a worker is ready, so the head unit is free.
            if self._warm_pending and not self._ever_ready:
                self._warm_pending = False
                self._compute_inline(self._head)
            else:
                self._wait(1.0)

    def _compute_inline(self, unit: int) -> None:
        try:
            if unit >= self._new and self._next_unit() is None:
                return
            start, stop = self._ranges[unit]
            try:
                result = compute_unit(self._plan, start, stop)
            except PipelineError as exc:
                self._done[unit] = ("err", exc)
                return
            self._done[unit] = ("ok", result)
            if self._use_shm and not self._res.blocks.target_size:
                self._size_blocks(shm.payload_size(*shm.dumps(result)))
        finally:
            self._spawn_deferred()

    def _size_blocks(self, nbytes: int) -> None:
        """Grows the blocks to fit ``nbytes``; on the first size, checks /dev/shm has room."""
        blocks = self._res.blocks
        first = not blocks.target_size
        blocks.note_payload(nbytes)
        if not first:
            return
        needed = blocks.target_size * (self._window + len(self._res.workers) + 2)
        if shm.shm_free_bytes() < needed:
            self._warn(
                f"{shm.SHM_DIR} has {shm.shm_free_bytes() / 2**20:.0f} MiB free but the "
                f"buffers need about {needed / 2**20:.0f} MiB"
            )

    # -- dispatching ----------------------------------------------------------------------

    def _next_unit(self) -> int | None:
        if self._redo:
            return heapq.heappop(self._redo)
        if self._exhausted or self._new >= self._head + self._window:
            return None
        rng = next(self._units, None)
        if rng is None:
            self._exhausted = True
            return None
        unit = self._new
        self._new += 1
        self._ranges[unit] = rng
        return unit

    def _dispatch(self) -> None:
        ready = [w for w in self._res.workers if w.ready]
        while ready:
            w = min(ready, key=lambda w: len(w.outstanding))
            if len(w.outstanding) >= self._buffer:
                return
            unit = self._next_unit()
            if unit is None:
                return
            block = self._res.blocks.acquire() if self._use_shm else None
            discarded = self._res.blocks.discarded
            forget, w.forgotten = discarded[w.forgotten :], len(discarded)
            start, stop = self._ranges[unit]
            try:
                w.send(("task", self._gen, unit, start, stop, block and block.name, forget))
            except OSError:
                if block is not None:
                    self._res.blocks.give_back(block)
                heapq.heappush(self._redo, unit)
                return  # the worker is dying; _wait will notice and replace it
            w.outstanding.append((self._gen, unit, block))

    # -- receiving ------------------------------------------------------------------------

    def _wait(self, timeout: float) -> None:
        """Handles every message that arrives within ``timeout`` seconds (0: only ready ones)."""
        for fd, _ in self._poller.poll(int(timeout * 1000)):
            w = self._by_fd.get(fd)
            if w is None:
                continue  # replaced while this batch of events was handled
            try:
                raw = w.results.recv_bytes()
            except (EOFError, OSError):
                self._replace(w)
                continue
            self._receive(w, pickle.loads(raw), len(raw))

    def _receive(self, w: Worker, message: tuple, nbytes: int) -> None:
        kind = message[0]
        if kind == "ready":
            w.ready = self._ever_ready = True
            self._spawn_deferred()
            return
        if kind == "fatal":
            self._finalizer()  # lock held: not close()
            raise WorkerError(f"worker {w.index} could not start:\n{message[1]}")
        gen, unit, block = w.outstanding.popleft()
        assert (gen, unit) == tuple(message[1:3]), "worker answered out of order"
        blocks = self._res.blocks
        if gen != self._gen:
            if block is not None:
                blocks.give_back(block)
            return
        if kind == "error":
            if block is not None:
                blocks.give_back(block)
            self._done[unit] = ("err", _remote_error(message[3], w.index))
            return
        if message[3] == "shm":
            assert block is not None
            layout, size = message[4]
            value = shm.read_payload(blocks.lease(block), layout)
        else:  # the result came pickled in the message itself
            if block is not None:
                blocks.give_back(block)
            value, size = message[4], nbytes
        if self._use_shm:
            self._size_blocks(size)
        self._done[unit] = ("ok", value)

    def _replace(self, w: Worker) -> None:
        """A worker died: reap it, start another, and compute its units again."""
        if not self._finalizer.alive:
            return  # the pool was closed: its pipes are closed, nobody died
        try:
            code = w.proc.wait(5.0)
        except subprocess.TimeoutExpired:
            w.proc.kill()
            code = w.proc.wait()
        fd = w.results.fileno()
        self._poller.unregister(fd)
        del self._by_fd[fd]
        w.close_pipes()
        if not w.ready:
            self._startup_deaths += 1
            if self._startup_deaths >= MAX_CRASHES:
                self._finalizer()  # lock held: not close()
                raise WorkerError(
                    f"worker processes keep dying before they start (exit code {code}); "
                    f"run with worker_count=0 to see the error in this process"
                )
        first = True
        for gen, unit, block in w.outstanding:
            if block is not None:
                self._res.blocks.give_back(block)
            if gen != self._gen:
                continue
            if first:  # a worker computes its units in order: the first one killed it
                first = False
                self._crashes[unit] = self._crashes.get(unit, 0) + 1
                if self._crashes[unit] >= MAX_CRASHES:
                    self._done[unit] = ("err", self._crash_error(unit, code))
                    continue
            heapq.heappush(self._redo, unit)
        i = self._res.workers.index(w)
        self._res.workers[i] = self._spawn(w.index)

    def _crash_error(self, unit: int, code: int) -> WorkerCrashError:
        start, stop = self._ranges[unit]
        keys = [record_index(self._plan, p) for p in range(start, stop)]
        how = f"signal {-code}" if code < 0 else f"exit code {code}"
        return WorkerCrashError(
            f"the unit of positions [{start}, {stop}) killed its worker {MAX_CRASHES} times "
            f"(last: {how}); it reads record indices {keys}; find the record that crashes "
            f"(e.g. with worker_count=0 under a debugger) and filter or repair it"
        )

    # -- shutting down --------------------------------------------------------------------

    @property
    def pids(self) -> list[int]:
        return [w.proc.pid for w in self._res.workers]

    def close(self) -> None:
        """Stops every worker and unlinks every block; waits for a call in progress."""
        with self._lock:
            self._finalizer()
