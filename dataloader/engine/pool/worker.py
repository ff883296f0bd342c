"""The worker process: receive tasks, compute their units, send the results back.

Started by :mod:`dataloader.engine.pool.process` as ``python -c <boot> TASK_FD RESULT_FD
CPUS`` (not through ``multiprocessing``, so the user's main script is never re-run and
a script without an ``if __name__ == "__main__":`` guard works). The boot line pins the
start-up to ``CPUS`` before any import; the worker imports what the pipeline needs and
nothing more, then takes back all the CPUs it may use. The messages are in
:mod:`dataloader.engine.pool.messages`.

The task channel is a Unix socket: a block lent for the first time comes with its
descriptor (:mod:`dataloader.engine.pool.shm`). The worker keeps the blocks it was lent
mapped until the parent says they were discarded; they have no name, so a worker has
nothing to clean up however the training process ends.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pickle
import queue
import signal
import socket
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

from dataloader.engine.pool.messages import Done, Failed, Fatal, Init, Ready, Task, error_payload

WATCH_INTERVAL_S = 0.2


def _watch_parent(parent_pid: int) -> None:
    """Exits once the parent (the training process, or the fork server a forked worker
    came from) has died. It imports nothing, since two threads importing one package at
    once can deadlock."""
    while True:
        time.sleep(WATCH_INTERVAL_S)
        if os.getppid() != parent_pid:
            os._exit(0)


def _receive_descriptor(task_fd: int) -> int:
    """The block descriptor that follows a task on the task socket (one byte carries it)."""
    sock = socket.socket(fileno=task_fd)
    try:
        data, fds, _, _ = socket.recv_fds(sock, 1, 1)
    finally:
        sock.detach()  # the descriptor stays the task channel's
    if not data:
        raise EOFError("the task channel closed")
    if len(fds) != 1:
        for fd in fds:
            os.close(fd)
        raise OSError(f"a task's block came with {len(fds)} descriptors, expected 1")
    return fds[0]


def _send(conn: Connection, message: Any) -> None:
    conn.send_bytes(pickle.dumps(message, protocol=5))


def _send_result(conn: Connection, blocks: dict[int, Any], task: Task, plan: Any, result: Any) -> None:
    """Writes the result into the lent block (grown to fit if need be), or (no block, or
    no memory to grow it) into the message.

    A result that does not pickle becomes a ``PipelineError`` naming the record, the
    operation and the type at fault (looked into only once pickling failed).
    """
    from dataloader.engine.pool.shm import dumps, payload_size, write_payload

    if task.block is not None:
        try:
            header, buffers = dumps(result)
        except Exception as exc:
            raise _unpicklable(plan, result, exc) from exc
        size = payload_size(header, buffers)
        target = blocks[task.block]
        if target.fit(size):
            layout = write_payload(target.mmap, header, buffers)
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


def _receive(
    tasks: Connection, blocks: dict[int, Any], queued: queue.Queue[Any], mapped_type: Any, hint: Any
) -> None:
    """Receives tasks as the pool sends them (up to ``worker_buffer_size`` ahead) and
    queues them for :func:`serve`; None at the end, or the error that ended it.

    A task that arrives while another is queued or being computed is hinted to the
    source (:func:`~dataloader.engine.compute.hint_unit`), so a remote source fetches
    its records while the unit before it is computed. Blocks are mapped here, in the
    order their descriptors come, and discarded ones unmapped: the pool discards only
    idle blocks, never one lent for a unit in this queue.
    """
    try:
        while True:
            task: Task = pickle.loads(tasks.recv_bytes())
            if task.block is not None and task.block not in blocks:
                blocks[task.block] = mapped_type(_receive_descriptor(tasks.fileno()))
            for ident in task.forget:
                mapped = blocks.pop(ident, None)
                if mapped is not None:
                    mapped.close()
            busy = queued.unfinished_tasks > 0  # an idle worker starts it now: no hint
            queued.put(task)
            if busy:
                hint(task.start, task.stop)
    except (EOFError, OSError):
        queued.put(None)
    except BaseException as exc:
        queued.put(exc)


def serve(
    tasks: Connection, results: Connection, progress_fd: int | None = None, server_pid: int = 0
) -> None:
    """The worker loop. Returns when the parent closes the task pipe.

    ``progress_fd``: the progress board's descriptor in this process, when it differs
    from the number in the config (a worker forked by the zygote received it anew).
    """
    import cloudpickle

    init: Init = pickle.loads(tasks.recv_bytes())
    config = init.config
    # A forked worker's parent is the fork server (``server_pid``, given by it: had it
    # died since the fork, os.getppid() here would name another process), which
    # outlives the training process only long enough to kill its children.
    watched = server_pid or config.parent_pid
    threading.Thread(target=_watch_parent, args=(watched,), daemon=True).start()
    try:
        from dataloader.engine.compute import compute_unit, hint_unit
        from dataloader.engine.pool.shm import Mapped
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
    blocks: dict[int, Mapped] = {}
    queued: queue.Queue[Task | BaseException | None] = queue.Queue()
    hint = functools.partial(hint_unit, plan)
    threading.Thread(target=_receive, args=(tasks, blocks, queued, Mapped, hint), daemon=True).start()
    while True:
        task = queued.get()
        if task is None:
            return
        if isinstance(task, BaseException):
            raise task
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
            if result.error is not None:  # cut at a failing record: its error travels along
                result.error = error_payload(result.error)
            _send_result(results, blocks, task, plan, result)
        except BaseException as exc:  # user code's SystemExit too: it is the unit's error
            _send(results, Failed(task.generation, task.unit, error_payload(exc)))
        if slot is not None:
            slot.stage(IDLE)
        queued.task_done()


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
    # The task channel closes when the pool stops this worker or the training process
    # dies (even by SIGKILL); the blocks it maps are freed with the last process mapping them.
    with contextlib.suppress(BrokenPipeError, EOFError, ConnectionResetError):
        serve(tasks, results, progress_fd, server_pid)


if __name__ == "__main__":
    main(sys.argv)
