"""The worker process: receive tasks, compute their units, send the results back.

Started by :mod:`dataloader.engine.pool.process` as ``python -c <boot> TASK_FD RESULT_FD
CPUS`` (not through ``multiprocessing``, so the user's main script is never re-run and
a script without an ``if __name__ == "__main__":`` guard works). The boot line pins the
start-up to ``CPUS`` before any import; the worker imports what the pipeline needs and
nothing more, then takes back all the CPUs it may use. The messages are in
:mod:`dataloader.engine.pool.messages`.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

from dataloader.engine.pool.messages import Done, Failed, Fatal, Init, Ready, Task, error_payload

WATCH_INTERVAL_S = 0.2
_BLOCK_PREFIX = ""  # the pool's block names start with it; set from the init message
_OWNER_PID = 0  # the training process, which owns them


def _watch_parent(parent_pid: int, owner_pid: int, block_prefix: str) -> None:
    """Exits once the parent (the training process, or the fork server a forked worker
    came from) has died, unlinking the pool's shared memory if the training process
    ``owner_pid`` is gone too. The caller has imported ``shm``: this thread imports
    nothing, since two threads importing one package at once can deadlock."""
    from dataloader.engine.pool.shm import unlink_if_orphaned  # already loaded

    while True:
        time.sleep(WATCH_INTERVAL_S)
        if os.getppid() != parent_pid:
            unlink_if_orphaned(block_prefix, owner_pid)
            os._exit(0)


def _send(conn: Connection, message: Any) -> None:
    conn.send_bytes(pickle.dumps(message, protocol=5))


def _send_result(conn: Connection, blocks: dict[str, Any], task: Task, plan: Any, result: Any) -> None:
    """Writes the result into the lent block, or (no block, or too small) into the message.

    A result that does not pickle becomes a ``PipelineError`` naming the record, the
    operation and the type at fault (looked into only once pickling failed).
    """
    from dataloader.engine.pool.shm import attach, dumps, payload_size, write_payload

    if task.block is not None:
        try:
            header, buffers = dumps(result)
        except Exception as exc:
            raise _unpicklable(plan, result, exc) from exc
        size = payload_size(header, buffers)
        target = blocks.get(task.block)
        if target is None:
            target = blocks[task.block] = attach(task.block)
        if size <= len(target):
            layout = write_payload(target, header, buffers)
            _send(conn, Done(task.generation, task.unit, layout, size, None))
            return
    # Pickled once, in the message: the parent takes the size from its length.
    try:
        data = pickle.dumps(Done(task.generation, task.unit, None, 0, result), protocol=5)
    except Exception as exc:
        raise _unpicklable(plan, result, exc) from exc
    conn.send_bytes(data)


def _unpicklable(plan: Any, result: Any, exc: Exception) -> Exception:
    from dataloader.engine.blame import unpicklable_result  # only on this failure path

    return unpicklable_result(plan, result, exc)


def serve(
    tasks: Connection, results: Connection, progress_fd: int | None = None, server_pid: int = 0
) -> None:
    """The worker loop. Returns when the parent closes the task pipe.

    ``progress_fd``: the progress board's descriptor in this process, when it differs
    from the number in the config (a worker forked by the zygote received it anew).
    """
    import cloudpickle

    global _BLOCK_PREFIX, _OWNER_PID
    init: Init = pickle.loads(tasks.recv_bytes())
    config = init.config
    _BLOCK_PREFIX, _OWNER_PID = config.block_prefix, config.parent_pid
    # A forked worker's parent is the fork server (``server_pid``, given by it: had it
    # died since the fork, os.getppid() here would name another process), which
    # outlives the training process only long enough to kill its children.
    watched = server_pid or config.parent_pid
    import dataloader.engine.pool.shm  # noqa: F401  (here, not first in the watcher thread)

    threading.Thread(
        target=_watch_parent, args=(watched, config.parent_pid, config.block_prefix), daemon=True
    ).start()
    try:
        from dataloader.engine.compute import compute_unit
        from dataloader.engine.pool.watch.progress import IDLE, SENDING, Slot

        plan = cloudpickle.loads(config.plan)
        init_fn = cloudpickle.loads(config.init_fn)
        if init_fn is not None:
            init_fn(config.worker_index, config.worker_count)
    except BaseException:
        _send(results, Fatal(traceback.format_exc()))
        return
    # Start-up kept off the parent's CPU (see process.startup_cpus); work may use them all.
    with contextlib.suppress(OSError):
        os.sched_setaffinity(0, config.cpus)
    # Where this worker is, for the parent's stall checks: a few stores per unit.
    slot = None
    board_fd = config.progress_fd if progress_fd is None else progress_fd
    if board_fd >= 0:
        slot = Slot(board_fd, config.worker_index, config.worker_count)
    _send(results, Ready(os.getpid()))
    blocks: dict[str, Any] = {}
    while True:
        try:
            task: Task = pickle.loads(tasks.recv_bytes())
        except (EOFError, OSError):
            return
        for name in task.forget:
            mapped = blocks.pop(name, None)
            if mapped is not None:
                mapped.close()
        try:
            if slot is not None:
                slot.begin(task.generation, task.unit)
            # passthrough=(): SIGINT is ignored here, so even a KeyboardInterrupt
            # comes from user code and becomes the error at its record.
            result = compute_unit(
                plan, task.start, task.stop, slot.stage if slot else None, passthrough=()
            )
            if slot is not None:
                slot.stage(SENDING)
            _send_result(results, blocks, task, plan, result)
        except BaseException as exc:  # user code's SystemExit too: it is the unit's error
            _send(results, Failed(task.generation, task.unit, error_payload(exc)))
        if slot is not None:
            slot.stage(IDLE)


def main(argv: list[str]) -> None:
    """A worker started as an interpreter: ``argv`` is ``[_, TASK_FD, RESULT_FD, CPUS]``."""
    run(int(argv[1]), int(argv[2]))


def run(task_fd: int, result_fd: int, progress_fd: int | None = None, server_pid: int = 0) -> None:
    """Serves the pool on these pipes until it closes them, then cleans up.

    ``progress_fd``, ``server_pid``: given by the fork server to a worker it forked (the
    progress board's descriptor there, -1: none; the fork server's pid); see :func:`serve`.
    """
    # Ctrl-C goes to the whole process group; the parent decides when workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    tasks = Connection(task_fd, writable=False)
    results = Connection(result_fd, readable=False)
    try:
        with contextlib.suppress(BrokenPipeError, EOFError, ConnectionResetError):
            serve(tasks, results, progress_fd, server_pid)
    finally:
        # The task pipe closes when the pool stops this worker or the training process
        # dies (even by SIGKILL). In the second case this is the only cleanup there is.
        if _BLOCK_PREFIX:
            from dataloader.engine.pool.shm import unlink_if_orphaned

            unlink_if_orphaned(_BLOCK_PREFIX, _OWNER_PID)


if __name__ == "__main__":
    main(sys.argv)
