"""The worker process: receive unit numbers, compute them, send results back.

Started by :mod:`dataloader.engine.pool.executor` as ``python -c <boot> TASK_FD RESULT_FD CPUS`` (not
through ``multiprocessing``, so the user's main script is never re-run and a script
without an ``if __name__ == "__main__":`` guard works). The boot line pins the start-up
to ``CPUS`` before any import; the worker imports what the pipeline needs and nothing
more, then takes back all the CPUs it may use.

Messages (pickled tuples) from the parent: ``("init", payload)`` once, then
``("task", generation, unit, start, stop, block_name, forget)``; the parent closing the
pipe means stop.
To the parent: ``("ready", pid)``, ``("done", generation, unit, where, data)`` and
``("error", generation, unit, data)``; ``("fatal", text)`` when start-up fails.
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

WATCH_INTERVAL_S = 0.2
_BLOCK_PREFIX = ""  # the pool's block names start with it; set from the init message


def _watch_parent(parent_pid: int, block_prefix: str) -> None:
    """Exits, unlinking the pool's shared memory, once the parent has died."""
    from dataloader.engine.pool.shm import unlink_prefixed

    while True:
        time.sleep(WATCH_INTERVAL_S)
        if os.getppid() != parent_pid:
            unlink_prefixed(block_prefix)
            os._exit(0)


def _error_payload(exc: BaseException) -> bytes:
    """The exception, its cause and the child's traceback, picklable whatever they are."""
    import cloudpickle

    text = "".join(traceback.format_exception(exc))
    cause = exc.__cause__
    try:
        return cloudpickle.dumps((exc, cause, text))
    except Exception:
        return cloudpickle.dumps((None, None, text))


def _send_result(conn: Connection, blocks: dict[str, Any], task: tuple, result: Any) -> None:
    """Writes the result into the lent block, or (no block, or too small) into the message."""
    from dataloader.engine.pool.shm import attach, dumps, payload_size, write_payload

    _, gen, unit, _, _, block_name, _ = task
    if block_name is not None:
        header, buffers = dumps(result)
        size = payload_size(header, buffers)
        target = blocks.get(block_name)
        if target is None:
            target = blocks[block_name] = attach(block_name)
        if size <= len(target):
            layout = write_payload(target, header, buffers)
            conn.send_bytes(pickle.dumps(("done", gen, unit, "shm", (layout, size))))
            return
    # Pickled once, in the message: the parent takes the size from its length.
    conn.send_bytes(pickle.dumps(("done", gen, unit, "pipe", result), protocol=5))


def serve(tasks: Connection, results: Connection) -> None:
    """The worker loop. Returns when the parent closes the pipe or says stop."""
    import cloudpickle

    global _BLOCK_PREFIX
    config = pickle.loads(pickle.loads(tasks.recv_bytes())[1])
    _BLOCK_PREFIX = config["block_prefix"]
    threading.Thread(
        target=_watch_parent, args=(config["parent_pid"], config["block_prefix"]), daemon=True
    ).start()
    try:
        from dataloader.engine.compute import compute_unit

        plan = cloudpickle.loads(config["plan"])
        init_fn = cloudpickle.loads(config["init_fn"])
        if init_fn is not None:
            init_fn(config["worker_index"], config["worker_count"])
    except BaseException:
        results.send_bytes(pickle.dumps(("fatal", traceback.format_exc())))
        return
    # Start-up kept off the parent's CPU (see pool._startup_cpus); work may use them all.
    with contextlib.suppress(OSError):
        os.sched_setaffinity(0, config["cpus"])
    results.send_bytes(pickle.dumps(("ready", os.getpid())))
    blocks: dict[str, Any] = {}
    while True:
        try:
            task = pickle.loads(tasks.recv_bytes())
        except (EOFError, OSError):
            return
        for name in task[6]:
            mapped = blocks.pop(name, None)
            if mapped is not None:
                mapped.close()
        _, gen, unit, start, stop, _, _ = task
        try:
            result = compute_unit(plan, start, stop)
        except Exception as exc:
            results.send_bytes(pickle.dumps(("error", gen, unit, _error_payload(exc))))
            continue
        try:
            _send_result(results, blocks, task, result)
        except Exception as exc:
            results.send_bytes(pickle.dumps(("error", gen, unit, _error_payload(exc))))


def main(argv: list[str]) -> None:
    # Ctrl-C goes to the whole process group; the parent decides when workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    tasks = Connection(int(argv[1]), writable=False)
    results = Connection(int(argv[2]), readable=False)
    try:
        with contextlib.suppress(BrokenPipeError, EOFError, ConnectionResetError):
            serve(tasks, results)
    finally:
        # The task pipe closes when the pool shuts down or the parent dies (even by
        # SIGKILL). Unlinking the pool's blocks is harmless in the first case (the parent
        # unlinks the same names) and is the only cleanup there is in the second.
        if _BLOCK_PREFIX:
            from dataloader.engine.pool.shm import unlink_prefixed

            unlink_prefixed(_BLOCK_PREFIX)


if __name__ == "__main__":
    main(sys.argv)
