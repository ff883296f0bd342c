"""The training process's side of the fork server (the protocol is in
:mod:`dataloader.engine.pool.zygote`): :class:`Zygote` starts the server and talks to it,
a thread of it reading the answers; :class:`ForkedChild` is a worker it forked, with the
parts of ``Popen`` the pool uses."""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from dataloader.engine.pool.process import boot_script, worker_env
from dataloader.engine.pool.zygote import (
    ANSWER_WAIT_S,
    BASE_MODULES,
    LOOK_S,
    LOST,
    PACKET,
    THREADED,
    process_state,
)

logger = logging.getLogger("dataloader")

# How long a server found gone (or killed: SIGKILL ends even a stopped one) is waited for.
REAP_S = 5.0

_BOOT = boot_script("dataloader.engine.pool.zygote.server", "serve", "serve(int(sys.argv[1]))", cpus_arg=2)


class ForkedChild:
    """A worker forked by a :class:`Zygote`, with the parts of ``Popen`` the pool uses."""

    def __init__(self, zygote: Zygote, ticket: int) -> None:
        self._zygote = zygote
        self._ticket = ticket
        self.returncode: int | None = None

    @property
    def lost(self) -> bool:
        """The server refused the fork or was lost before it: no child was ever made."""
        return self._zygote.pid_of(self._ticket) is None

    @property
    def error(self) -> str | None:
        """Why ``fork()`` failed in the server (``EAGAIN``...); None if it did not fail."""
        self._zygote.pid_of(self._ticket)
        return self._zygote.errors.get(self._ticket)

    @property
    def pid(self) -> int:
        """The child's pid (waits for the server's answer; -1 if the server was lost)."""
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
    """The training process's side of a fork server (see the module docstring).

    Starting it costs a few milliseconds here (the server imports in its own process,
    on ``boot_cpus``, while this one goes on); answers are read by a daemon thread.

    Args:
        env: the environment of the server and so of every worker.
        boot_cpus: the CPUs the server imports on (see ``process.startup_cpus``).
        modules: what it imports first.
    """

    def __init__(self, env: dict[str, str], boot_cpus: str, modules: Sequence[str] = BASE_MODULES) -> None:
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
        self.owner = os.getpid()
        self._sock = mine
        self._send_lock = threading.Lock()
        self._cond = threading.Condition()
        self._tickets = self._pools = 0
        self._pids: dict[int, int | None] = {}
        self.errors: dict[int, str] = {}  # ticket: why fork() failed
        self._reaped: dict[int, int | None] = {}
        self._imported = set(modules)
        self.alive = True
        self._closing = False  # close() was called: the server's end is expected
        self.key: Any = None  # the environment it was started for (see shared())
        self.tainted: str | None = None  # a module whose import started a thread in it
        self._open_pools = 0
        self._retiring = False  # replaced as the shared server: closes after its last pool
        self._next_look = 0.0  # when check() next looks at the server's state
        try:
            self._send(("import", list(modules), tuple(sorted(os.sched_getaffinity(0)))))
            threading.Thread(target=self._read_answers, name="granary-fork-server", daemon=True).start()
        except (OSError, RuntimeError) as exc:  # RuntimeError: no thread (a pids limit)
            self.close(0.5)
            raise OSError(f"the fork server could not start: {exc}") from exc

    # -- talking ----------------------------------------------------------------------------

    def _send(self, message: tuple[Any, ...], fds: Sequence[int] = ()) -> None:
        data = pickle.dumps(message)
        with self._send_lock:
            if not self.alive:
                raise OSError("the fork server has exited")
            try:
                if fds:
                    socket.send_fds(self._sock, [data], list(fds))
                else:
                    self._sock.send(data)
            except OSError:
                self._lose("its socket closed")
                raise

    def _read_answers(self) -> None:
        """The reader thread: files each answer and wakes its waiter, until the socket
        closes (the server died, or this side closed)."""
        while True:
            try:
                data = self._sock.recv(PACKET)
            except OSError:
                data = b""
            if not data:
                self._lose("it exited")
                self._reap()  # it is gone (its socket closed with it), or killed just now
                return
            answer = pickle.loads(data)
            if answer[0] == "threaded":  # a module the server imported started a thread
                self.tainted = answer[1]
                THREADED.add(answer[1].partition(".")[0])
                logger.warning(
                    "granary: importing %s started a thread in the fork server, which then "
                    "cannot fork; this pool's workers start as interpreters, the next "
                    "pools get a server without it", answer[1])
                continue
            with self._cond:
                if answer[0] == "forked":
                    _, ticket, pid, error = answer
                    self._pids[ticket] = pid
                    if error is not None:
                        self.errors[ticket] = error
                else:
                    self._reaped[answer[1]] = answer[2]
                self._cond.notify_all()

    def _await(self, answered: Callable[[], bool], limit_s: float) -> None:
        """Waits until ``answered()`` or the server is lost; loses a server that gives no
        answer in ``limit_s`` or is found stopped (``SIGSTOP``: it never answers)."""
        deadline = time.monotonic() + limit_s
        with self._cond:
            while not answered() and self.alive:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._lose(f"it gave no answer in {limit_s:.0f} s")
                    break
                self._cond.wait(min(left, LOOK_S))
                if not answered() and self.alive and process_state(self.proc.pid) in ("T", "t"):
                    self._lose("it is stopped (SIGSTOP or a debugger)")

    def check(self) -> None:
        """Loses the server if it is stopped, looking at most every ``LOOK_S``: what a pool
        whose workers are not ready yet calls while it waits (a fork request sent to a
        stopped server is never answered, and its descriptors stay in the socket, so no
        pipe closes to say so)."""
        now = time.monotonic()
        if self.alive and now >= self._next_look:
            self._next_look = now + LOOK_S
            if process_state(self.proc.pid) in ("T", "t"):
                self._lose("it is stopped (SIGSTOP or a debugger)")

    def _lose(self, why: str) -> None:
        """The server is of no more use: kill it (its workers then exit too, and are
        replaced by interpreters) and wake every waiter."""
        with self._cond:
            # Not after close(): the server is busy ending its children then.
            was_alive = self.alive and not self._closing and os.getpid() == self.owner
            self.alive = False
            self._cond.notify_all()
        if was_alive:
            logger.warning("granary: fork server %d lost (%s); workers start as interpreters", self.proc.pid, why)
            with contextlib.suppress(OSError):
                self.proc.kill()

    def _reap(self) -> None:
        """Collects the exit status of a server that is gone, so it does not stay a zombie
        child of this process (for the rest of its life when no other pool comes)."""
        if os.getpid() != self.owner:  # not ours to wait for
            return
        with contextlib.suppress(subprocess.TimeoutExpired, ChildProcessError):
            self.proc.wait(REAP_S)

    # -- what pools ask ---------------------------------------------------------------------

    def preload(self, modules: Iterable[str]) -> None:
        """Imports ``modules`` in the server now (those not asked for before)."""
        new = [m for m in modules if m not in self._imported]
        if new:
            self._imported.update(new)
            self._send(("import", new, None))

    def open_pool(self, modules: Iterable[str]) -> int:
        """Registers a pool (see the module docstring); returns its number. Its workers
        get the environment of this process now."""
        with self._cond:
            self._pools += 1
            self._open_pools += 1
            pool = self._pools
        new = [m for m in modules if m not in self._imported]
        self._imported.update(new)
        env = worker_env()
        env.pop("GRANARY_SYS_PATH")  # what the boot script takes; the server set sys.path
        self._send(("pool", pool, new, env))
        return pool

    def close_pool(self, pool: int) -> None:
        """The pool is done (its workers were stopped and reaped). A retiring server
        closes after its last pool."""
        with contextlib.suppress(OSError):
            self._send(("close", pool))
        with self._cond:
            self._open_pools -= 1
            last = self._retiring and self._open_pools <= 0
        if last:
            self.close()
        elif not self.alive:  # lost: reaped now, whether or not the reader thread got to it
            self._reap()

    def retire(self) -> None:
        """Another server replaces this one for new pools: close it once the pools it
        serves are done (now, if there are none)."""
        with self._cond:
            self._retiring = True
            idle = self._open_pools <= 0
        if idle:
            self.close()

    def fork(self, fds: Sequence[int], pool: int, cpus: Iterable[int]) -> ForkedChild:
        """Asks for a worker of ``pool`` on ``fds`` (task read end, result write end,
        shared ones), on ``cpus``. Does not wait for the answer. OSError if the server
        is gone."""
        with self._cond:
            self._tickets += 1
            ticket = self._tickets
        self._send(("fork", ticket, pool, tuple(sorted(cpus))), fds)
        return ForkedChild(self, ticket)

    def pid_of(self, ticket: int) -> int | None:
        """The pid of a fork request's child; None if the server refused or was lost."""
        self._await(lambda: ticket in self._pids, ANSWER_WAIT_S)
        return self._pids.get(ticket)

    def reap(self, pid: int, timeout: float) -> int | None:
        """The exit code of ``pid`` once it exits within ``timeout`` s, else None."""
        try:
            self._send(("reap", pid, timeout))
        except OSError:
            return LOST
        self._await(lambda: pid in self._reaped, timeout + ANSWER_WAIT_S)
        with self._cond:
            return self._reaped.pop(pid, LOST)

    def close(self, timeout: float = 2.0) -> None:
        """Says goodbye and closes the socket (the server then kills what is left of its
        children and exits) and waits for it, killing it after ``timeout``."""
        if os.getpid() != self.owner:  # inherited by a fork of the training process
            self._abandon()
            return
        self._closing = True
        with contextlib.suppress(OSError):
            self._send(("bye",))
        self.alive = False
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the reader thread
        with contextlib.suppress(OSError):
            self._sock.close()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def _abandon(self) -> None:
        """In a forked copy of the training process: drop the descriptor without a word
        (a goodbye or a shutdown would end the server the original process uses)."""
        self.alive = False
        with contextlib.suppress(OSError):
            self._sock.close()
