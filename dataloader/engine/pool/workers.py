"""The worker processes of one pool: start, replace, retire and reap them.

A :class:`WorkerSet` owns what must be released whatever happens to the pool: the
processes, its registration with the fork server and the progress board. Workers are
forked by the training process's fork server (:mod:`~dataloader.engine.pool.zygote`),
which outlives the pool (every pool of the process shares it) and has imported what
they need already; where it cannot start, or once it refuses, dies or is found stopped,
each worker starts as a fresh interpreter (:mod:`~dataloader.engine.pool.process`),
which is slower but not wrong. A worker that cannot start because the container's
pids limit is reached is a :class:`~dataloader.errors.WorkerError` naming the limit.

It keeps the poll map: which result pipe belongs to which worker, in one
``select.poll`` object for the life of the pool (building a selector per wait, as
``multiprocessing.connection.wait`` does, cost ~70 us of parent CPU per batch).

It knows nothing of units. The scheduling loop (:mod:`~dataloader.engine.pool.executor`)
says when to start, replace, retire or stop a worker, and learns which workers started
(to give each room in its window) and which died (to compute their units again).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import pickle
import select
import subprocess
from collections.abc import Iterator
from multiprocessing.connection import wait
from typing import Any, Protocol

from dataloader.engine.pool import zygote as fork_server
from dataloader.engine.pool.autoscale import private_bytes, usable_cpus
from dataloader.engine.pool.messages import Init, WorkerConfig
from dataloader.engine.pool.process import WorkerProcess, pids_limit, start_failure, stop_all
from dataloader.engine.pool.watch.progress import Board
from dataloader.errors import LoaderClosedError, WorkerError

MAX_CRASHES = 3  # deaths of a unit's worker, or of starting workers, that make an error

logger = logging.getLogger("dataloader")


class Closing(LoaderClosedError):
    """A worker was to start after ``close()`` was called (the loop rewords it, naming
    the unit its consumer waited for)."""


class Workers(Protocol):
    """What the scheduling loop (:mod:`~dataloader.engine.pool.executor`) asks of its
    worker processes: :class:`WorkerSet` here, a fake in the loop's tests. Workers are
    told apart by ``key``; the loop reads ``index``, ``ready``, ``retiring`` and calls
    ``send(task)`` (OSError: it is dying)."""

    workers: list[WorkerProcess]  # every worker that takes units or is retiring
    deferred: list[int]  # slots still to start
    board: Board | None  # progress of each slot; None: no stall checks
    stopping: bool  # close() was called: start no process

    def start(self, count: int, spare_a_core: bool) -> Iterator[WorkerProcess]: ...
    def start_deferred(self) -> Iterator[WorkerProcess]: ...
    def add(self, count: int) -> Iterator[WorkerProcess]: ...
    def events(self, timeout: float) -> Iterator[tuple[WorkerProcess, Any, int]]: ...
    def wait_readable(self, timeout: float) -> None: ...
    def bury(self, w: WorkerProcess, timed_out: bool) -> int: ...
    def replace(self, w: WorkerProcess) -> Iterator[WorkerProcess]: ...
    def retire(self, count: int) -> list[WorkerProcess]: ...
    def stop(self, w: WorkerProcess) -> None: ...
    def reap_retired(self) -> None: ...
    def live(self) -> list[WorkerProcess]: ...
    def worker_bytes(self) -> int: ...
    def close(self) -> None: ...


class WorkerSet:
    """The worker processes of one pool (see the module docstring).

    Args:
        slots: the most workers there may be (their indices, and the board's slots).
        plan_bytes: the pickled plan every worker runs (the fork server preloads the
            modules it names).
        init_fn: the pickled ``init_fn(worker_index, worker_count)``.
    """

    def __init__(self, slots: int, plan_bytes: bytes, init_fn: bytes) -> None:
        self.slots = slots
        self._plan_bytes = plan_bytes
        self._init_fn = init_fn
        self.workers: list[WorkerProcess] = []  # in slot order at start; retiring ones too
        self.retired: list[WorkerProcess] = []  # stopped by the autoscaler, not yet reaped
        self.deferred: list[int] = []  # slots to start once a worker is ready
        self.stopping = False  # set by close() from any thread: no process starts after it
        self._startup_deaths = 0
        self._worker_bytes = 0  # private memory of one worker, measured once one is ready
        # The process's fork server (started now if the loader did not start it), told
        # what this pool's plan imports; None: every worker starts an interpreter.
        self.zygote = fork_server.shared()
        self._pool = 0
        if self.zygote is not None:
            try:
                self._pool = self.zygote.open_pool(fork_server.preload_modules(plan_bytes))
            except OSError:  # it died just now: interpreters
                self.zygote = None
        try:
            self.board: Board | None = Board(slots)
        except OSError as exc:  # no memfd (not Linux, or an old kernel): no stall checks
            logger.warning("granary: no progress board (%s); stuck workers go unnoticed", exc)
            self.board = None
        self._poller = select.poll()
        self._by_fd: dict[int, WorkerProcess] = {}

    # -- starting -------------------------------------------------------------------------

    def start(self, count: int, spare_a_core: bool) -> Iterator[WorkerProcess]:
        """Starts workers ``0 .. count-1``, yielding each as it starts.

        Start-up must not slow the first batch. Forked workers cost next to nothing: all
        are asked for at once. Without a fork server, while the parent computes
        warm-start units (``spare_a_core``), only as many start as leave it a core of its
        own (their imports take ~0.3 s of CPU each); the rest are deferred until
        :meth:`start_deferred` (the first warm unit is done, or a worker is ready).
        """
        now = count
        if spare_a_core and self.zygote is None:
            now = max(1, min(now, usable_cpus() - 1))
        self.deferred = list(range(now, count))
        for index in range(now):
            yield self._join(self._spawn(index))

    def start_deferred(self) -> Iterator[WorkerProcess]:
        """Starts the deferred workers (none once ``close()`` was called)."""
        while self.deferred and not self.stopping:
            yield self._join(self._spawn(self.deferred.pop(0)))

    def add(self, count: int) -> Iterator[WorkerProcess]:
        """Starts ``count`` more workers in the free slots, lowest first."""
        used = {w.index for w in self.workers}
        free = [i for i in range(self.slots) if i not in used]
        for index in free[:count]:
            yield self._join(self._spawn(index))

    def _join(self, worker: WorkerProcess) -> WorkerProcess:
        self.workers.append(worker)
        return worker

    def _spawn(self, index: int) -> WorkerProcess:
        if self.stopping:  # close() released the pool while this thread was busy
            raise Closing("the loader was closed while a worker was starting")
        board = self.board
        if board is not None:
            board.clear(index)  # what the slot's previous worker wrote is not the new one's
        config = WorkerConfig(
            parent_pid=os.getpid(),
            plan=self._plan_bytes,
            init_fn=self._init_fn,
            worker_index=index,
            worker_count=self.slots,
            cpus=tuple(sorted(os.sched_getaffinity(0))),
            progress_fd=board.fd if board is not None else -1,
        )
        shared = (board.fd,) if board is not None else ()
        init = pickle.dumps(Init(config))
        zygote = self.zygote
        worker = None
        if zygote is not None:
            fork = functools.partial(zygote.fork, pool=self._pool, cpus=config.cpus)
            with contextlib.suppress(OSError):  # the fork server is gone: start one as before
                worker = WorkerProcess(index, init, shared, fork)
            if worker is None:
                self._drop_zygote()
        if worker is None:
            worker = WorkerProcess(index, init, shared)
        fd = worker.results.fileno()
        self._by_fd[fd] = worker
        self._poller.register(fd, select.POLLIN)
        return worker

    # -- listening ------------------------------------------------------------------------

    def events(self, timeout: float) -> Iterator[tuple[WorkerProcess, Any, int]]:
        """``(worker, message, size in bytes)`` for every message that arrives within
        ``timeout`` seconds (0: only those there now); ``message`` is None for a worker
        whose pipe closed (it died: :meth:`bury` it). Read one at a time, so a worker
        replaced while an earlier event was handled is skipped.

        While a forked worker is not ready, the fork server is looked at (a stopped one
        is killed: the pipes of the workers it was asked for close, and they start as
        interpreters)."""
        zygote = self.zygote
        if zygote is not None and not all(w.ready for w in self.workers):
            zygote.check()
        for fd, _ in self._poller.poll(int(timeout * 1000)):
            w = self._by_fd.get(fd)
            if w is None:
                continue  # replaced while this batch of events was handled
            try:
                message, nbytes = w.receive()
            except (EOFError, OSError):
                yield w, None, 0
                continue
            yield w, message, nbytes

    def wait_readable(self, timeout: float) -> None:
        """Waits until some worker has something to say, or ``timeout`` seconds (for a
        thread that holds no lock: the pipes may be closed under it)."""
        conns = [w.results for w in self.workers]
        # multiprocessing's wait() polls where poll exists (never select(), which cannot
        # wait on a descriptor beyond 1024: a trainer with many open files has those).
        with contextlib.suppress(OSError, ValueError):  # a pipe closed under us
            wait(conns, timeout)

    # -- ending ---------------------------------------------------------------------------

    def bury(self, w: WorkerProcess, timed_out: bool) -> int:
        """A worker died, or was killed (``timed_out``): reaps it and forgets it; returns
        its exit code.

        A fork server that refused or died is dropped (not the pipeline's fault):
        interpreters start from now on. Raises WorkerError when the fork server could
        not fork (``EAGAIN``: a pids limit), or when workers keep dying before they are
        ready.
        """
        code = w.reap()
        self._forget(w)
        w.close_pipes()
        if isinstance(w.proc, fork_server.ForkedChild):
            error = w.proc.error
            if error is not None:  # an interpreter would not start either
                raise start_failure(w.index, error)
            if w.proc.lost or code == fork_server.LOST:
                self._drop_zygote()
                return code
        if not timed_out and not w.ready:
            self._startup_deaths += 1
            if self._startup_deaths >= MAX_CRASHES:
                raise WorkerError(
                    f"worker processes keep dying before they start (exit code {code}); "
                    f"{_pids_hint()}run with worker_count=0 to see the error in this process"
                )
        return code

    def replace(self, w: WorkerProcess) -> Iterator[WorkerProcess]:
        """Starts a buried worker's successor in its slot, yielding it (none if it was
        retiring: it leaves the set)."""
        i = self.workers.index(w)
        if w.retiring:
            del self.workers[i]
            return
        self.workers[i] = self._spawn(w.index)
        yield self.workers[i]

    def retire(self, count: int) -> list[WorkerProcess]:
        """Marks ``count`` live workers (the highest indices) as retiring: they get no
        more units, and are stopped (:meth:`stop`) once they hold none."""
        chosen = sorted(self.live(), key=lambda w: -w.index)[:count]
        for w in chosen:
            w.retiring = True
        return chosen

    def stop(self, w: WorkerProcess) -> None:
        """A retiring worker holds no unit: close its task pipe (it exits) and forget it;
        it is reaped later (:meth:`reap_retired`) so that this call does not wait."""
        self._forget(w)
        self.workers.remove(w)
        with contextlib.suppress(OSError):
            w.tasks.close()
        self.retired.append(w)

    def reap_retired(self) -> None:
        for w in list(self.retired):
            try:
                w.proc.wait(0)
            except subprocess.TimeoutExpired:  # still exiting: next time
                continue
            w.close_pipes()
            self.retired.remove(w)

    def _forget(self, w: WorkerProcess) -> None:
        fd = w.results.fileno()
        self._poller.unregister(fd)
        del self._by_fd[fd]

    def _drop_zygote(self) -> None:
        """This pool forks no more (the server lives on for other pools, if it can)."""
        if self.zygote is not None:
            self.zygote.close_pool(self._pool)
            self.zygote = None

    def close(self) -> None:
        """Stops every child within a bounded time, the fork server and the board."""
        stop_all([*self.workers, *self.retired])
        self.workers.clear()
        self.retired.clear()
        self._drop_zygote()
        if self.board is not None:
            self.board.close()

    # -- looking --------------------------------------------------------------------------

    def live(self) -> list[WorkerProcess]:
        """The workers that take units (not retiring)."""
        return [w for w in self.workers if not w.retiring]

    def worker_bytes(self) -> int:
        """Private memory of one worker, measured once the first is ready (0 before)."""
        live = self.live()
        if not self._worker_bytes and live and live[0].ready:
            self._worker_bytes = private_bytes(live[0].pid)
        return self._worker_bytes


def _pids_hint() -> str:
    """Under a pids limit, the likeliest cause of workers that die at once (a worker that
    cannot start its threads exits with code 1), for the error's message."""
    limit = pids_limit()
    if limit is None:
        return ""
    most, used, path = limit
    return (
        f"this container limits processes and threads to pids.max={most} ({path}; {used} "
        f"in use now), and a worker that cannot start a thread dies like this: lower "
        f"worker_count or raise the limit; or "
    )
