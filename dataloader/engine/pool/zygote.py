"""The fork server: one per training process, kept across pools, so ``iter()`` forks its
workers in milliseconds. Here are both sides of its protocol (below): the training
process's (:class:`Zygote`, and the shared instance, :func:`shared`) and the server's
(:class:`Server`).

A worker started as a fresh interpreter spends ~0.3 s of CPU importing numpy, the
engine and the pipeline's modules before its first unit. The fork server pays that once
per training process: a fresh interpreter (never a fork of the training process, which
may run JAX threads) started in the background when a ``DataLoader`` with workers is
built (or when the first pool needs it), which imports the engine and then serves every
pool of the process, train and eval loaders and every ``iter()`` alike, forking each
worker from itself (a script that changes ``sys.path``, its working directory or a
setting the server's imports read between loaders gets a new one, see :func:`shared`).
Forked workers also share those pages copy-on-write. This is how the first batch comes
fast without any user code running in the training process (see ``warm_start`` of
:class:`~dataloader.DataLoader`).

What the server imports is the engine, numpy and cloudpickle, plus, for each pool, the
modules its pickled plan names whose packages import without starting threads
(:data:`PRELOADABLE`); anything else (the user's own modules, JAX, pyarrow, which
start threads) is imported by each worker after the fork. The server checks that it has
no other Python thread before it forks (else it refuses, and the pool starts
interpreters).

Protocol (one ``SOCK_SEQPACKET`` socket, one pickled tuple per packet):

* ``("import", modules, cpus)``: import these (first request: the base modules; then
  the CPUs the server itself may use);
* ``("pool", pool, modules, block_prefix, env)``: a pool opens: import what its plan
  needs; its workers get ``env`` (the training process's environment now, as a fresh
  worker would); where its result blocks have names (``/dev/shm``), they start with
  ``block_prefix`` and are unlinked if the training process dies (empty: unnamed
  blocks, nothing to do);
* ``("fork", ticket, pool, cpus)`` with the child's descriptors attached (task pipe,
  result pipe, progress board); answer ``("forked", ticket, pid, error)``: ``pid`` None
  when no child was made, ``error`` then why (``fork()`` failed, e.g. ``EAGAIN`` at a
  pids limit), or None (refused: the server has threads);
* ``("reap", pid, timeout_s)``; answer ``("reaped", pid, code)`` once the child exited or
  ``timeout_s`` passed, ``code`` as ``Popen.returncode`` (negative: killed by that
  signal), None if still alive. Reaps wait concurrently: one pool's wait never holds up
  another pool's fork;
* ``("close", pool)``: the pool is done; the server kills any child of it still alive;
* ``("bye",)``: the training process closes the server (at exit, or to replace it).

Answers come as they are ready, matched by ticket or pid; a thread of the training
process reads them. Children stay zombies until their pool reaps them, so a pid the
pool knows is never reused under it. When the training process's end closes (even on
SIGKILL) the server kills every child it has and exits; without a goodbye it also waits
for the training process to be gone and unlinks every open pool's named blocks.

Failure modes the pool survives: a server that dies, refuses or cannot start (workers
start as interpreters), and a *stopped* one (``SIGSTOP``): a parent that waits for an
answer, or for forked workers to be ready, looks at the server's state every
``LOOK_S`` and, finding it stopped, kills it and goes on without it within a second,
rather than waiting ``ANSWER_WAIT_S`` (or for ever). The next pool gets a new server.
A ``fork()`` that fails in the server (``EAGAIN`` at a pids limit) is answered, not
fatal to it: the pool raises an error naming the limit.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import pickle
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from dataloader.engine.pool.process import boot_script, startup_cpus, worker_env

# GRANARY_FORK_SERVER=0 starts every worker as a fresh interpreter instead.
ENABLED = os.environ.get("GRANARY_FORK_SERVER", "1") != "0"
# Top-level packages the server may import from a plan: none starts a thread on import.
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
# Environment variables read when an interpreter starts or when the server's modules
# are imported (GRANARY_SYS_PATH is sys.path): a change starts a new server.
IMPORT_SETTINGS = ("GRANARY_", "PYTHON", "OPENBLAS_", "OMP_", "MKL_", "NUMPY_", "LD_")
PACKET = 1 << 18  # a request carries an environment
# How long the parent waits for an answer beyond what it asked for (imports included).
ANSWER_WAIT_S = 60.0
# How often a waiting parent looks whether the server was stopped (SIGSTOP).
LOOK_S = 0.25
# Exit code reported for a worker whose fork server was lost before it could say more.
LOST = 255

logger = logging.getLogger("dataloader")

_BOOT = boot_script("dataloader.engine.pool.zygote", "serve", "serve(int(sys.argv[1]))", cpus_arg=2)


def preload_modules(plan_bytes: bytes) -> list[str]:
    """The modules a fork server imports for a plan: the base ones, and those the pickled
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


def process_state(pid: int) -> str:
    """The state letter of ``pid`` in ``/proc`` (``T``: stopped); ``""`` if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


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
                return
            answer = pickle.loads(data)
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

    # -- what pools ask ---------------------------------------------------------------------

    def preload(self, modules: Iterable[str]) -> None:
        """Imports ``modules`` in the server now (those not asked for before)."""
        new = [m for m in modules if m not in self._imported]
        if new:
            self._imported.update(new)
            self._send(("import", new, None))

    def open_pool(self, modules: Iterable[str], block_prefix: str = "") -> int:
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
        self._send(("pool", pool, new, block_prefix, env))
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


# -- the process's shared server -----------------------------------------------------------

_shared: Zygote | None = None
_shared_lock = threading.Lock()


def shared() -> Zygote | None:
    """This process's fork server, started now if there is none, if the last one was
    lost, or if the environment changed since it started; None when switched off
    (``GRANARY_FORK_SERVER=0``) or it cannot start.

    A forked worker gets the environment of the training process when its pool opened
    (see :meth:`Zygote.open_pool`), but the server's ``sys.path`` and working directory,
    and the modules the server imported were set up under the server's environment
    (``import dataloader`` installs the Grain alias from ``GRANARY_GRAIN_ALIAS``, numpy
    reads its thread settings). So the server is kept only while those are what a
    fresh worker would get now (:data:`IMPORT_SETTINGS`): a script that changes one
    between loaders gets a new server for the pools that follow (the old one ends with
    its last pool). Other variables (JAX sets ``TF_CPP_MIN_LOG_LEVEL`` when it starts)
    keep the server.
    """
    global _shared
    if not ENABLED:
        return None
    env = worker_env()
    key = (sorted(kv for kv in env.items() if kv[0].startswith(IMPORT_SETTINGS)), os.getcwd())
    with _shared_lock:
        server = _shared
        if server is not None and server.alive and server.owner == os.getpid() and server.key == key:
            return server
        if server is not None and server.owner == os.getpid():
            if server.alive:
                server.retire()
            else:
                server.close(0.5)  # lost: reap it
        _shared = None
        try:
            _shared = Zygote(env, startup_cpus())
            _shared.key = key
        except OSError as exc:  # e.g. no process left under a pids limit
            logger.warning("granary: no fork server (%s); workers start as interpreters", exc)
        return _shared


def prestart(plan_bytes: bytes) -> None:
    """Starts the shared server in the background, if it is not running, and has it
    import what this plan needs: what a ``DataLoader`` with workers does when built, so
    that its first ``iter()`` only forks."""
    server = shared()
    if server is not None:
        with contextlib.suppress(OSError):
            server.preload(preload_modules(plan_bytes))


def server_pid() -> int | None:
    """The pid of this process's fork server, if one is running."""
    server = _shared
    if server is not None and server.alive and server.owner == os.getpid():
        return server.proc.pid
    return None


def shutdown() -> None:
    """Closes this process's fork server (at interpreter exit; the next pool starts a
    new one). Pools still using it see it lost and start interpreters."""
    global _shared
    with _shared_lock:
        server, _shared = _shared, None
    if server is not None:
        server.close()


def _after_fork_in_child() -> None:
    global _shared, _shared_lock
    _shared_lock = threading.Lock()  # another thread may have held it at the fork
    if _shared is not None:
        _shared._abandon()
        _shared = None


atexit.register(shutdown)
os.register_at_fork(after_in_child=_after_fork_in_child)


# -- the server process -------------------------------------------------------------------


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


def _unlink_blocks(prefixes: Iterable[str], owner: int) -> None:
    """Unlinks the named blocks of a dead training process's pools, where blocks have
    names (with unnamed blocks there is nothing to do)."""
    import importlib

    unlink = getattr(importlib.import_module("dataloader.engine.pool.shm"), "unlink_if_orphaned", None)
    for prefix in prefixes:
        if prefix and unlink is not None:
            with contextlib.suppress(OSError):
                unlink(prefix, owner, wait_s=5.0)


class Server:
    """The server's state and loop (in its own interpreter; see the module docstring).

    Args:
        sock: its end of the socket.
        owner: the training process.
    """

    def __init__(self, sock: socket.socket, owner: int) -> None:
        self.sock, self.owner, self.me = sock, owner, os.getpid()
        self.children: dict[int, int] = {}  # pid: pool
        self.prefixes: dict[int, str] = {}  # pool: block prefix
        self.envs: dict[int, dict[str, str]] = {}  # pool: its workers' environment
        self.reaps: dict[int, float] = {}  # pid: when to answer "still alive"
        self.orphans: set[int] = set()  # killed when their pool closed; reaped quietly
        self.parting = False  # the owner said goodbye: it cleans up its own blocks

    def run(self) -> None:
        import select

        while True:
            wait = 0.002 if self.reaps else (0.1 if self.orphans else None)
            try:
                readable = select.select([self.sock], [], [], wait)[0]
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
            self.parting = True
            return False
        if kind == "import":
            _import(request[1])
            if request[2]:
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(0, request[2])
        elif kind == "pool":
            _import(request[2])
            self.prefixes[request[1]] = request[3]
            self.envs[request[1]] = request[4]
        elif kind == "fork":
            pid, error = self.fork(fds, request[2], request[3])
            self.answer(("forked", request[1], pid, error))
        elif kind == "reap":
            self.reaps[request[1]] = time.monotonic() + request[2]
        elif kind == "close":
            self.prefixes.pop(request[1], None)
            self.envs.pop(request[1], None)
            for pid, pool in list(self.children.items()):
                if pool == request[1]:  # not stopped by its pool: should not happen
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                    del self.children[pid]
                    self.orphans.add(pid)
        return True

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
        """The owner is gone or done: nothing forked may outlive it, and if it died,
        neither may its pools' blocks."""
        left = set(self.children) | self.orphans
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5.0
        while left and time.monotonic() < deadline:
            left = {pid for pid in left if _try_reap(pid) is None}
            time.sleep(0.002)
        if not self.parting:  # the owner's end closed without a word: it died
            _unlink_blocks(list(self.prefixes.values()), self.owner)


def _import(modules: Iterable[str]) -> None:
    import importlib

    for name in modules:
        with contextlib.suppress(BaseException):  # the worker reports it, at its import
            importlib.import_module(name)


def serve(sock_fd: int) -> None:
    """The server's main (runs in its own interpreter)."""
    # Ctrl-C goes to the whole process group; the pools decide when workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    Server(socket.socket(fileno=sock_fd), os.getppid()).run()
