"""A fork server: workers forked in milliseconds from one clean process that imported once.

A worker started as a fresh interpreter spends ~0.3 s of CPU importing numpy, the
engine and the pipeline's modules before its first unit. With 14 workers that is
several CPU-seconds at start-up (on a small machine, more than a second before the
first worker is ready), and again for every replaced or added worker. The zygote pays
it once: a fresh interpreter (never a fork of the training process, which may run JAX
threads) imports the engine and the pipeline's safe modules, then forks each worker
from itself on request. Forked workers also share those pages copy-on-write.

What the zygote imports is the engine, numpy and cloudpickle, plus the modules the
pickled plan names whose packages import without starting threads
(:data:`PRELOADABLE`); anything else (the user's own modules, JAX, pyarrow, which
start threads) is imported by each worker after the fork, as before. The zygote checks
that it has no other Python thread before it forks.

Protocol (one ``SOCK_SEQPACKET`` socket, one pickled tuple per packet; the zygote
answers in request order):

* parent: ``("init", modules, block_prefix, cpus)`` once; the zygote imports, then
  serves;
* parent: ``("fork", ticket)`` with the child's descriptors attached (task pipe, result
  pipe, progress board); zygote: ``("forked", ticket, pid)``;
* parent: ``("reap", pid, timeout_s)``; zygote: ``("reaped", pid, code)``, ``code``
  as ``Popen.returncode`` (negative: killed by that signal), None if still alive;
* parent: ``("bye",)`` when the pool closes, just before its end of the socket.

Children stay zombies until the parent reaps them, so a pid the parent knows is never
reused under it. When the parent's end closes (the pool stopped, or the training
process died, even by SIGKILL) the zygote kills the children it still has and exits.
Without a goodbye the training process died: the zygote first waits for it to be gone
(a killed process closes its descriptors before it looks dead) and unlinks the pool's
shared-memory blocks.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

from dataloader.engine.pool.process import boot_script

# GRANARY_FORK_SERVER=0 starts every worker as a fresh interpreter instead.
ENABLED = os.environ.get("GRANARY_FORK_SERVER", "1") != "0"
# Top-level packages the zygote may import from the plan: none starts a thread on import.
PRELOADABLE = frozenset({"dataloader", "numpy", "cloudpickle", "array_record", "PIL"})
# A dotted name that starts with one of them (a name inside another only finds a
# module that is loaded anyway, which is harmless).
_PRELOADABLE_NAME = re.compile(rb"(?:%s)(?:\.\w+)*" % b"|".join(p.encode() for p in sorted(PRELOADABLE)))
# Imported whatever the plan holds: what every worker needs before its first unit.
BASE_MODULES = (
    "numpy",
    "numpy.random",  # shuffling samplers use it; numpy imports it only on first use (~14 ms)
    "cloudpickle",
    "dataloader.engine.compute",
    "dataloader.engine.pool.worker",
    "dataloader.engine.pool.shm",
    "dataloader.engine.pool.watch.progress",
)
PACKET = 1 << 16
# How long the parent waits for an answer beyond what it asked for (imports included).
ANSWER_WAIT_S = 60.0
# Exit code reported for a worker whose fork server was lost before it could say more.
LOST = 255

_BOOT = boot_script("dataloader.engine.pool.zygote", "serve", "serve(int(sys.argv[1]))", cpus_arg=2)


def preload_modules(plan_bytes: bytes) -> list[str]:
    """The modules a zygote imports for a plan: the base ones, and those the pickled
    plan names that are loaded here and belong to :data:`PRELOADABLE`.

    One regular-expression pass over the bytes (0.05 s for 10 MB, against 1.1 to 1.9 s for a
    walk of the pickle's opcodes): a module name that appears in the plan's data rather
    than as a reference only preloads a module this process has loaded anyway.
    """
    names = dict.fromkeys(BASE_MODULES)
    for match in _PRELOADABLE_NAME.finditer(plan_bytes):
        module = match.group().decode()
        if module in sys.modules:
            names.setdefault(module)
    return list(names)


class ForkedChild:
    """A worker forked by a :class:`Zygote`, with the parts of ``Popen`` the pool uses."""

    def __init__(self, zygote: Zygote, ticket: int) -> None:
        self._zygote = zygote
        self._ticket = ticket
        self.returncode: int | None = None

    @property
    def lost(self) -> bool:
        """The zygote refused the fork or was lost before it: no child was ever made."""
        return self._zygote.pid_of(self._ticket) is None

    @property
    def pid(self) -> int:
        """The child's pid (waits for the zygote's answer; -1 if the zygote was lost)."""
        pid = self._zygote.pid_of(self._ticket)
        return -1 if pid is None else pid

    def _signal(self, signum: int) -> None:
        pid = self.pid
        if self.returncode is None and pid > 0:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)  # a zombie until reaped: the pid cannot be reused

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def wait(self, timeout: float | None = None) -> int:
        """The exit code, as ``Popen.wait``; ``subprocess.TimeoutExpired`` if still alive."""
        if self.returncode is not None:
            return self.returncode
        pid = self.pid
        if pid < 0:
            self.returncode = LOST
            return LOST
        code = self._zygote.reap(pid, 3600.0 if timeout is None else timeout)
        if code is None:
            raise subprocess.TimeoutExpired(f"worker {pid}", timeout or 0.0)
        self.returncode = code
        return code


class Zygote:
    """The parent's side of a fork server (see the module docstring).

    Args:
        modules: what to import before forking (see :func:`preload_modules`).
        block_prefix: the pool's block names; the zygote unlinks them if the parent dies.
        cpus: the CPUs forked workers may use.
        env: the environment of the zygote and so of every worker.
        boot_cpus: the CPUs the zygote imports on (see ``process.startup_cpus``).
    """

    def __init__(
        self,
        modules: Sequence[str],
        block_prefix: str,
        cpus: Iterable[int],
        env: dict[str, str],
        boot_cpus: str,
    ) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _BOOT, str(theirs.fileno()), boot_cpus],
                pass_fds=(theirs.fileno(),),
                env=env,
                stdin=subprocess.DEVNULL,
            )
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
        self._sock = mine
        self._lock = threading.Lock()
        self._tickets = 0
        self._pids: dict[int, int | None] = {}
        self._reaped: dict[int, int | None] = {}
        self.alive = True
        self._send(("init", list(modules), block_prefix, tuple(sorted(cpus))))

    def _send(self, message: tuple[Any, ...], fds: Sequence[int] = ()) -> None:
        data = pickle.dumps(message)
        try:
            if fds:
                socket.send_fds(self._sock, [data], list(fds))
            else:
                self._sock.send(data)
        except OSError:
            self.alive = False
            raise

    def _read_one(self, timeout: float) -> None:
        """Reads one answer and files it (lock held). A closed socket, or no answer in
        ``timeout`` s (a zygote stuck in an import): the zygote is lost."""
        import select

        data = b""
        with contextlib.suppress(OSError, ValueError):
            if select.select([self._sock], [], [], timeout)[0]:
                data = self._sock.recv(PACKET)
        if not data:
            self._lose()
            return
        answer = pickle.loads(data)
        if answer[0] == "forked":
            self._pids[answer[1]] = answer[2]
        else:
            self._reaped[answer[1]] = answer[2]

    def fork(self, fds: Sequence[int]) -> ForkedChild:
        """Asks for a worker on ``fds`` (task read end, result write end, shared ones).

        Does not wait: the zygote may still be importing. Raises OSError if it is gone.
        """
        with self._lock:
            if not self.alive:
                raise OSError("the fork server has exited")
            self._tickets += 1
            ticket = self._tickets
            self._send(("fork", ticket), fds)
        return ForkedChild(self, ticket)

    def _lose(self) -> None:
        self.alive = False
        with contextlib.suppress(OSError):
            self.proc.kill()

    def pid_of(self, ticket: int) -> int | None:
        """The pid of a fork request's child; None if the zygote refused or was lost."""
        with self._lock:
            while ticket not in self._pids and self.alive:
                self._read_one(ANSWER_WAIT_S)
            return self._pids.get(ticket)

    def reap(self, pid: int, timeout: float) -> int | None:
        """The exit code of ``pid`` once it exits within ``timeout`` s, else None."""
        with self._lock:
            if not self.alive:
                return LOST
            try:
                self._send(("reap", pid, timeout))
            except OSError:
                return LOST
            while pid not in self._reaped and self.alive:
                self._read_one(timeout + ANSWER_WAIT_S)
            return self._reaped.pop(pid, LOST)

    def close(self, timeout: float = 2.0) -> None:
        """Says goodbye and closes the socket (the zygote then kills what is left of its
        children and exits) and waits for it, killing it after ``timeout``."""
        with contextlib.suppress(OSError):
            self._sock.send(pickle.dumps(("bye",)))
        with contextlib.suppress(OSError):
            self._sock.close()
        self.alive = False
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# -- the zygote process -------------------------------------------------------------------


def _reap(pid: int, timeout: float) -> int | None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return LOST
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.002)


def _child(fds: list[int], server_pid: int) -> None:
    """In the forked worker: never returns into the zygote's loop."""
    code = 0
    try:
        if "numpy.random" in sys.modules:  # as a fresh interpreter would: its own entropy
            sys.modules["numpy.random"].seed()
        from dataloader.engine.pool.worker import run

        run(fds[0], fds[1], fds[2] if len(fds) > 2 else -1, server_pid)
    except BaseException:
        code = 1
    finally:
        os._exit(code)


def serve(sock_fd: int) -> None:
    """The zygote's loop (runs in its own interpreter; see the module docstring)."""
    import importlib

    # Ctrl-C goes to the whole process group; the parent decides when workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock = socket.socket(fileno=sock_fd)
    init = sock.recv(PACKET)
    if not init:
        return
    _, modules, block_prefix, cpus = pickle.loads(init)
    owner = os.getppid()  # the training process
    for name in modules:
        with contextlib.suppress(BaseException):  # the worker reports it, at its import
            importlib.import_module(name)
    with contextlib.suppress(OSError):
        os.sched_setaffinity(0, cpus)  # the workers inherit it
    children: set[int] = set()
    me = os.getpid()
    parting = False  # the parent said goodbye: it lives on and cleans up its own blocks
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, PACKET, 8)
        except OSError:
            data, fds = b"", []
        if not data:
            break
        request = pickle.loads(data)
        if request[0] == "bye":
            parting = True
            break
        if request[0] == "fork":
            # A fork is safe only without other threads (their locks would be lost).
            pid = os.fork() if threading.active_count() == 1 else -1
            if pid == 0:
                sock.close()
                _child(fds, me)
            for fd in fds:
                os.close(fd)
            if pid > 0:
                children.add(pid)
            answer: tuple[Any, ...] = ("forked", request[1], pid if pid > 0 else None)
        else:  # "reap"
            code = _reap(request[1], request[2])
            if code is not None:
                children.discard(request[1])
            answer = ("reaped", request[1], code)
        # The parent may have closed its end meanwhile (while this imported or forked):
        # what it sent before, a goodbye or nothing, is still there to read.
        with contextlib.suppress(OSError):
            sock.send(pickle.dumps(answer))
    # The parent is gone or done with this fork server: nothing it forked may outlive
    # it, and if the training process died, neither may the pool's blocks.
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for pid in children:
        _reap(pid, 5.0)
    if not parting:  # the parent's end closed without a word: it died
        from dataloader.engine.pool.shm import unlink_if_orphaned

        unlink_if_orphaned(block_prefix, owner, wait_s=5.0)
