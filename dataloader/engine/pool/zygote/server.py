"""The fork server's side (the protocol is in :mod:`dataloader.engine.pool.zygote`): a
fresh interpreter that imports what pools ask for and forks their workers from itself,
answering as it goes, until the training process says goodbye or dies."""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

from dataloader.engine.pool.zygote import LOST, PACKET


def _try_reap(pid: int) -> int | None:
    """The exit code of child ``pid`` if it has exited (LOST if it is no child), else None."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return LOST
    return os.waitstatus_to_exitcode(status) if done else None


def _child(fds: list[int], server_pid: int, cpus: Sequence[int], env: dict[str, str] | None) -> None:
    """In the forked worker: never returns into the server's loop."""
    code = 0
    try:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, cpus)
        if env is not None:  # the training process's environment when its pool opened
            os.environ.clear()
            os.environ.update(env)
        if "numpy.random" in sys.modules:  # as a fresh interpreter would: its own entropy
            sys.modules["numpy.random"].seed()
        from dataloader.engine.pool.worker import run

        run(fds[0], fds[1], fds[2] if len(fds) > 2 else -1, server_pid)
    except BaseException:
        code = 1
    finally:
        os._exit(code)


class Server:
    """The server's state and loop (in its own interpreter; see the module docstring).

    Args:
        sock: its end of the socket.
        owner: the training process.
    """

    def __init__(self, sock: socket.socket, owner: int) -> None:
        self.sock, self.owner, self.me = sock, owner, os.getpid()
        self.children: dict[int, int] = {}  # pid: pool
        self.envs: dict[int, dict[str, str]] = {}  # pool: its workers' environment
        self.reaps: dict[int, float] = {}  # pid: when to answer "still alive"
        self.orphans: set[int] = set()  # killed when their pool closed; reaped quietly

    def run(self) -> None:
        # poll, never select(): the socket keeps the number it had in the training process
        # (pass_fds), beyond 1024 in one with many open files, which select() cannot wait on.
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        while True:
            wait_ms = 2 if self.reaps else (100 if self.orphans else None)
            try:
                readable = poller.poll(wait_ms)
            except OSError:
                break
            if readable and not self.handle():
                break
            self.reap_ready()
        self.finish()

    def handle(self) -> bool:
        """Serves one request; False once the owner is gone or said goodbye."""
        try:
            data, fds, _, _ = socket.recv_fds(self.sock, PACKET, 8)
        except OSError:
            data, fds = b"", []
        if not data:
            return False
        request = pickle.loads(data)
        kind = request[0]
        if kind == "bye":
            return False
        if kind == "import":
            self.load(request[1])
            if request[2]:
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(0, request[2])
        elif kind == "pool":
            self.load(request[2])
            self.envs[request[1]] = request[3]
        elif kind == "fork":
            pid, error = self.fork(fds, request[2], request[3])
            self.answer(("forked", request[1], pid, error))
        elif kind == "reap":
            self.reaps[request[1]] = time.monotonic() + request[2]
        elif kind == "close":
            self.envs.pop(request[1], None)
            for pid, pool in list(self.children.items()):
                if pool == request[1]:  # not stopped by its pool: should not happen
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                    del self.children[pid]
                    self.orphans.add(pid)
        return True

    def load(self, modules: Iterable[str]) -> None:
        """Imports what a pool needs; says which module started a thread, if one did (the
        training process then leaves it out of its next server)."""
        threaded = _import(modules)
        if threaded is not None:
            self.answer(("threaded", threaded))

    def fork(self, fds: list[int], pool: int, cpus: Sequence[int]) -> tuple[int | None, str | None]:
        """Forks a worker on ``fds``: ``(pid, None)``, ``(None, why fork() failed)``, or
        ``(None, None)`` when forking is unsafe here (another thread runs)."""
        try:
            if threading.active_count() != 1:  # its locks would be lost in the child
                return None, None
            try:
                pid = os.fork()
            except OSError as exc:  # EAGAIN at a pids limit, ENOMEM: refuse, live on
                return None, f"fork() failed: {exc}"
            if pid == 0:
                self.sock.close()
                _child(fds, self.me, cpus, self.envs.get(pool))
            self.children[pid] = pool
            return pid, None
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def answer(self, message: tuple[Any, ...]) -> None:
        # The owner may have closed its end meanwhile: what it sent is still there to read.
        with contextlib.suppress(OSError):
            self.sock.send(pickle.dumps(message))

    def reap_ready(self) -> None:
        """Answers the reaps whose child exited or whose time is up."""
        now = time.monotonic()
        for pid, deadline in list(self.reaps.items()):
            code = _try_reap(pid)
            if code is None and now < deadline:
                continue
            del self.reaps[pid]
            if code is not None:
                self.children.pop(pid, None)
            self.answer(("reaped", pid, code))
        for pid in list(self.orphans):
            if _try_reap(pid) is not None:
                self.orphans.discard(pid)

    def finish(self) -> None:
        """The owner is gone or done: nothing forked may outlive it."""
        left = set(self.children) | self.orphans
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5.0
        while left and time.monotonic() < deadline:
            left = {pid for pid in left if _try_reap(pid) is None}
            time.sleep(0.002)


def _import(modules: Iterable[str]) -> str | None:
    """Imports ``modules``; returns the first whose import started a thread (then the
    server can no longer fork), or None."""
    import importlib

    for name in modules:
        with contextlib.suppress(BaseException):  # the worker reports it, at its import
            importlib.import_module(name)
        if threading.active_count() != 1:
            return name
    return None


def serve(sock_fd: int) -> None:
    """The server's main (runs in its own interpreter)."""
    # Ctrl-C goes to the whole process group; the pools decide when workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    Server(socket.socket(fileno=sock_fd), os.getppid()).run()
