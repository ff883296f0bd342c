"""Worker process lifecycle: start a child with its two pipes, and stop children for sure.

A worker is forked by the training process's fork server (:mod:`~dataloader.engine.pool.zygote`),
or, without one, is ``python -c <boot> TASK_FD RESULT_FD CPUS`` started with
``subprocess``. Either way it is never a fork of the training process (which may run
JAX threads), and never ``multiprocessing``, so the user's main script is never re-run
(a script without an ``if __name__ == "__main__":`` guard works). It holds exactly two
pipe ends of its pool; closing the task pipe is its signal to stop, and its result pipe
closing tells the parent it died, at once, whatever killed it.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import pickle
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from dataloader.errors import WorkerError

if TYPE_CHECKING:
    from dataloader.engine.pool.zygote import ForkedChild

STOP_GRACE_S = 2.0
_KEYS = itertools.count()
# The folder that holds the ``dataloader`` package (site-packages, or the checkout).
_PACKAGE_HOME = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
)

# Runs before anything is imported, so even the imports stay off the parent's CPU. The
# child takes the parent's sys.path before importing anything, so it resolves modules
# exactly as the parent does (a user's own ``operations.py`` stays theirs, and ours stay
# ``dataloader.operations``); the folder holding ``dataloader`` is a last resort.
def boot_script(module: str, name: str, call: str, cpus_arg: int) -> str:
    """``python -c`` code that pins itself to the CPUs in ``sys.argv[cpus_arg]`` (if
    any), takes the parent's ``sys.path``, imports ``name`` from ``module`` and runs
    ``call``: how workers and the fork server start."""
    return (
        "import json, os, sys\n"
        f"if sys.argv[{cpus_arg}]: os.sched_setaffinity(0, {{int(c) for c in sys.argv[{cpus_arg}].split(',')}})\n"
        "sys.path[:] = json.loads(os.environ.pop('GRANARY_SYS_PATH'))\n"
        "try:\n"
        f"    from {module} import {name}\n"
        "except ImportError:\n"
        "    sys.path.append(os.environ['GRANARY_HOME'])\n"
        f"    from {module} import {name}\n"
        f"{call}\n"
    )


_BOOT = boot_script("dataloader.engine.pool.worker", "main", "main(sys.argv)", cpus_arg=3)


def startup_cpus() -> str:
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


def worker_env() -> dict[str, str]:
    """The environment of a worker (or of the fork server that forks workers)."""
    # Workers never touch accelerators; JAX, if a user operation imports it, stays on CPU.
    return dict(
        os.environ,
        GRANARY_SYS_PATH=json.dumps(sys.path),
        GRANARY_HOME=_PACKAGE_HOME,
        JAX_PLATFORMS="cpu",
        # A stream built inside a worker (a user's map that iterates a dataset) stays in
        # that worker: the default worker count (dataloader.dataset.context) is for the
        # training process.
        GRANARY_WORKER_COUNT="0",
    )


class WorkerProcess:
    """One child process and its two pipes.

    Args:
        index: the worker's slot in the pool (kept by its replacement).
        init: the pickled :class:`~dataloader.engine.pool.messages.Init` message,
            written by a thread because it may exceed the pipe's buffer while the child
            is still starting up.
        shared_fds: more descriptors the child inherits (the progress board): under the
            same numbers when started as an interpreter, handed to ``worker.run`` by the
            fork server when forked.
        fork: ``fork(fds)`` asks the fork server for the worker on these descriptors
            (None: start an interpreter). Raises OSError if the fork server is gone.

    Raises :class:`~dataloader.errors.WorkerError` naming the limit when no process
    or thread can be started (a pids limit, ``ulimit -u``).
    """

    def __init__(
        self,
        index: int,
        init: bytes,
        shared_fds: tuple[int, ...] = (),
        fork: Callable[[tuple[int, ...]], ForkedChild] | None = None,
    ) -> None:
        self.index = index
        self.key = next(_KEYS)  # unique for the life of this process (pids are not)
        self.ready = False
        self.retiring = False  # gets no more units; stops once it has answered all it holds
        # The task channel is a Unix socket so that block descriptors can follow a task.
        task_r, task_w = (s.detach() for s in socket.socketpair())
        res_r, res_w = os.pipe()
        self.proc: subprocess.Popen[bytes] | ForkedChild
        try:
            if fork is not None:
                self.proc = fork((task_r, res_w, *shared_fds))
            else:
                try:
                    self.proc = subprocess.Popen(
                        [sys.executable, "-c", _BOOT, str(task_r), str(res_w), startup_cpus()],
                        pass_fds=(task_r, res_w, *shared_fds),
                        env=worker_env(),
                        stdin=subprocess.DEVNULL,
                    )
                except BlockingIOError as exc:  # EAGAIN: no process left (a pids limit)
                    raise start_failure(index, f"the interpreter did not start: {exc!r}") from exc
        except BaseException:
            os.close(task_w)
            os.close(res_r)
            raise
        finally:
            os.close(task_r)
            os.close(res_w)
        self.tasks = Connection(task_w, readable=False)
        self.results = Connection(res_r, writable=False)
        try:
            threading.Thread(target=self._send_quietly, args=(init,), daemon=True).start()
        except RuntimeError as exc:  # "can't start new thread": threads count as pids
            self.proc.kill()
            self.close_pipes()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(1.0)
            raise start_failure(index, f"{exc} (a thread to send its plan)") from exc

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def where(self) -> str:
        return f"pid {self.proc.pid}"

    def _send_quietly(self, data: bytes) -> None:
        with contextlib.suppress(OSError):
            self.tasks.send_bytes(data)

    def send(self, message: Any, fds: tuple[int, ...] = ()) -> None:
        """Sends one message, then each of ``fds`` (one byte carrying it, ``SCM_RIGHTS``);
        raises OSError if the child is gone."""
        self.tasks.send_bytes(pickle.dumps(message))
        if fds:
            sock = socket.socket(fileno=self.tasks.fileno())
            try:
                for fd in fds:
                    socket.send_fds(sock, [b"\0"], [fd])
            finally:
                sock.detach()  # the descriptor stays the task channel's

    def receive(self) -> tuple[Any, int]:
        """The next message and its size in bytes; EOFError or OSError if the child died."""
        raw = self.results.recv_bytes()
        return pickle.loads(raw), len(raw)

    def reap(self, timeout: float = 5.0) -> int:
        """Waits for a dying child (killing it after ``timeout``); returns its exit code."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def close_pipes(self) -> None:
        for conn in (self.tasks, self.results):
            with contextlib.suppress(OSError):
                conn.close()


def pids_limit() -> tuple[int, int, str] | None:
    """The tightest pids limit of this process's control group and those above it (a
    container's limit on processes and threads): ``(pids.max, pids.current, file)``, or
    None without one. cgroup v1 (``pids`` controller) or v2."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    found: list[tuple[int, int, str]] = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            top = "/sys/fs/cgroup"  # v2
        elif "pids" in controllers.split(","):
            top = "/sys/fs/cgroup/pids"
        else:
            continue
        parts = [p for p in path.split("/") if p]
        for depth in range(len(parts), -1, -1):  # a parent's limit binds its children
            folder = os.path.join(top, *parts[:depth])
            try:
                with open(os.path.join(folder, "pids.max")) as f:
                    text = f.read().strip()
                with open(os.path.join(folder, "pids.current")) as f:
                    current = int(f.read().strip())
            except (OSError, ValueError):
                continue
            if text.isdigit():
                found.append((int(text), current, os.path.join(folder, "pids.max")))
    return min(found) if found else None


def start_failure(index: int, why: str) -> WorkerError:
    """The error for worker ``index`` that could not start (``why``: what failed), naming
    the pids limit where there is one."""
    limit = pids_limit()
    if limit is not None:
        most, used, path = limit
        return WorkerError(
            f"could not start worker {index}: the pids limit of this container is reached "
            f"(pids.max={most} in {path}, {used} in use; threads count too): {why}; lower "
            f"worker_count (worker_count='auto' keeps within it), or raise the limit "
            f"(docker run --pids-limit, the pod's pids limit)"
        )
    return WorkerError(
        f"could not start worker {index}: {why}; the system refused a new process or "
        f"thread (ulimit -u, kernel.threads-max, or memory): lower worker_count"
    )


def stop_all(workers: Iterable[WorkerProcess]) -> None:
    """Stops every child within a bounded time: EOF, then SIGTERM, then SIGKILL."""
    workers = list(workers)
    # Closing a worker's task pipe is its signal to stop (EOF), whatever it was doing;
    # a message could race with the init message still being written by its thread.
    for w in workers:
        with contextlib.suppress(OSError):
            w.tasks.close()
    deadline = time.monotonic() + STOP_GRACE_S
    for w in workers:
        try:
            w.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            w.proc.terminate()
    for w in workers:
        w.reap(1.0)
        w.close_pipes()
