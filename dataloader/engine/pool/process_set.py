"""Worker processes: the :class:`~dataloader.engine.pool.workers.Workers` of child processes.

A :class:`ProcessSet` owns what must be released whatever happens to the pool: the
processes, its registration with the fork server, the progress board and the result
blocks (:class:`~dataloader.engine.pool.transport.Transport`): a unit goes to a worker
as a pickled :class:`~dataloader.engine.pool.messages.Task`, its result comes back in
shared memory. Workers are
forked by the training process's fork server (:mod:`~dataloader.engine.pool.zygote`),
which outlives the pool (every pool of the process shares it) and has imported what
they need already; where it cannot start, or once it refuses, dies or is found stopped,
each worker starts as a fresh interpreter (:mod:`~dataloader.engine.pool.process`),
which is slower but not wrong. A worker that cannot start because the container's
pids limit is reached is a :class:`~dataloader.errors.WorkerError` naming the limit.

It keeps the poll map: which result pipe belongs to which worker, in one
``select.poll`` object for the life of the pool (building a selector per wait, as
``multiprocessing.connection.wait`` does, cost ~70 us of parent CPU per batch).

It knows nothing of the order of units. The scheduling loop (:mod:`~dataloader.engine.pool.executor`)
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
from typing import Any

from dataloader.engine.compute import UnitResult
from dataloader.engine.pool import zygote as fork_server
from dataloader.engine.pool.autoscale import private_bytes, usable_cpus
from dataloader.engine.pool.autoscale.measure import worker_memory
from dataloader.engine.pool.messages import Init, Task, WorkerConfig, remote_error
from dataloader.engine.pool.process import WorkerProcess, pids_limit, start_failure, stop_all
from dataloader.engine.pool.shm import block_room
from dataloader.engine.pool.transport import Transport
from dataloader.engine.pool.watch.progress import Board
from dataloader.engine.pool.workers import MAX_CRASHES, Closing, Slots
from dataloader.errors import WorkerError

logger = logging.getLogger("dataloader")


class ProcessSet(Slots):
    """The worker processes of one pool (see the module docstring).

    Args:
        slots: the most workers there may be (their indices, and the board's slots).
        plan_bytes: the pickled plan every worker runs (the fork server preloads the
            modules it names).
        init_fn: the pickled ``init_fn(worker_index, worker_count)``.
        why: how the kind was chosen, for ``stats()``.
    """

    kind = "processes"
    handover = None  # processes are the last kind: nothing to hand over to
    stop_words = "the worker was killed and replaced"
    stop_verb = "killing it"

    def __init__(self, slots: int, plan_bytes: bytes, init_fn: bytes, why: str = "asked for") -> None:
        super().__init__(slots)
        self._why = why
        self._plan_bytes = plan_bytes
        self._init_fn = init_fn
        self.transport = Transport()
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

    def _first(self, count: int, spare_a_core: bool) -> int:
        """Start-up must not slow the first batch. Forked workers cost next to nothing:
        all are asked for at once. Without a fork server, while the parent computes
        warm-start units (``spare_a_core``), only as many start as leave it a core of its
        own (their imports take ~0.3 s of CPU each); the rest are deferred until
        ``start_deferred`` (the first warm unit is done, or a worker is ready)."""
        if spare_a_core and self.zygote is None:
            return max(1, min(count, usable_cpus() - 1))
        return count

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

    # -- units --------------------------------------------------------------------------

    def send(self, w: WorkerProcess, generation: int, unit: int, start: int, stop: int, blocks_needed: int) -> Any:
        """Sends the unit with a block lent for its result (the token); OSError: the
        worker is dying (the block is given back)."""
        transport = self.transport
        block, forget, fds = transport.lend(w.key)
        ident = block.ident if block is not None else None
        try:
            w.send(Task(generation, unit, start, stop, ident, forget), fds)
        except OSError:
            transport.give_back(block)
            raise
        return block

    def give_back(self, token: Any) -> None:
        self.transport.give_back(token)

    def result(self, w: WorkerProcess, token: Any, message: Any, nbytes: int, blocks_needed: int) -> UnitResult:
        value: UnitResult = self.transport.take(token, message, nbytes, w.index, blocks_needed)
        if value.error is not None:  # cut at a failing record (compute_unit)
            value.error = remote_error(value.error, w.index)
        return value

    def error(self, w: WorkerProcess, payload: Any) -> Exception:
        return remote_error(payload, w.index)

    def note_local_result(self, result: UnitResult, blocks_needed: int) -> None:
        self.transport.note_local_result(result, blocks_needed)

    def kill(self, w: WorkerProcess) -> None:
        w.proc.kill()

    def describe(self) -> dict[str, Any]:
        return {"worker_kind": "processes", "why": self._why}

    def footprint(self) -> tuple[int, int, int, int | None]:
        cost, growth = worker_memory(self)
        if not self.transport.use_shm:
            return cost, growth, 0, None
        return cost, growth, self.transport.blocks.target_size, block_room()

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
        """Stops every child within a bounded time, the fork server, the board and the
        result blocks."""
        stop_all([*self.workers, *self.retired])
        self.transport.close()
        self.workers.clear()
        self.retired.clear()
        self._drop_zygote()
        if self.board is not None:
            self.board.close()

    # -- looking --------------------------------------------------------------------------

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
