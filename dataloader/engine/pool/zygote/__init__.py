"""The fork server: one per training process, kept across pools, so ``iter()`` forks its
workers in milliseconds. This module holds the settings and the process's shared
server (:func:`shared`); the two sides of the protocol below are
:mod:`~dataloader.engine.pool.zygote.client` (the training process's) and
:mod:`~dataloader.engine.pool.zygote.server` (the server's).

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
modules its plan's objects come from (:func:`preload_modules`: the user's pipeline
module and what it imports, torch, tokenizers, jinja2, ...); ``__main__``, JAX and the
like are imported by each worker after the fork. The server checks that it has no other Python thread before it forks (else it
refuses, and the pool starts interpreters); a module whose import started one is
reported (``("threaded", module)``), and the next server of the process leaves it out.

Protocol (one ``SOCK_SEQPACKET`` socket, one pickled tuple per packet):

* ``("import", modules, cpus)``: import these (first request: the base modules; then
  the CPUs the server itself may use);
* ``("pool", pool, modules, env)``: a pool opens: import what its plan needs; its
  workers get ``env`` (the training process's environment now, as a fresh worker
  would);
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
SIGKILL) the server kills every child it has and exits. The pools' result blocks have
no name (:mod:`~dataloader.engine.pool.shm`): nothing is left to clean up.

Failure modes the pool survives: a server that dies, refuses or cannot start (workers
start as interpreters), and a *stopped* one (``SIGSTOP``): a parent that waits for an
answer, or for forked workers to be ready, looks at the server's state every
``LOOK_S`` and, finding it stopped, kills it and goes on without it within a second,
rather than waiting ``ANSWER_WAIT_S`` (or for ever). The next pool gets a new server. A
server lost is reaped as soon as its socket closes (and by the pool that found it gone,
at the latest when it closes): it never stays a zombie child of the training process.
A ``fork()`` that fails in the server (``EAGAIN`` at a pids limit) is answered, not
fatal to it: the pool raises an error naming the limit.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import sys
import threading

from dataloader.engine.pool.pickling import PickledPlan
from dataloader.engine.pool.process import startup_cpus, worker_env

__all__ = [
    "ANSWER_WAIT_S", "BASE_MODULES", "ENABLED", "IMPORT_SETTINGS", "LOOK_S", "LOST", "NEVER_PRELOAD",
    "PACKET", "PRELOADABLE", "THREADED", "ForkedChild", "Zygote", "preload_modules", "prestart", "process_state",
    "server_pid", "shared", "shutdown",
]

# GRANARY_FORK_SERVER=0 starts every worker as a fresh interpreter instead.
ENABLED = os.environ.get("GRANARY_FORK_SERVER", "1") != "0"
# Top-level packages the server may import from a plan found only as bytes: none starts
# a thread on import.
PRELOADABLE = frozenset({"dataloader", "numpy", "cloudpickle", "array_record", "PIL"})
# Never imported by the server, even when a plan's objects come from them: JAX and
# TensorFlow start runtimes that must not be forked, Ray and gRPC hold connections and
# threads per process. ``__main__`` is the user's script (workers never re-run it).
NEVER_PRELOAD = frozenset({"__main__", "__mp_main__", "builtins", "jax", "jaxlib", "tensorflow",
                           "tf_keras", "keras", "ray", "grpc"})
# Top-level packages whose import started a thread in a fork server of this process
# (the server reports them): later servers do not import them, so they can fork.
THREADED: set[str] = set()
# A dotted name that starts with one of them (a name inside another only finds a
# module that is loaded anyway, which is harmless).
_PRELOADABLE_NAME = re.compile(rb"(?:%s)(?:\.\w+)*" % b"|".join(p.encode() for p in sorted(PRELOADABLE)))
# Imported whatever the plan holds: what every worker needs before its first unit.
BASE_MODULES: tuple[str, ...] = (
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


def preload_modules(plan_bytes: bytes) -> list[str]:
    """The modules a fork server imports for a plan: the base ones, then those the plan's
    objects come from.

    A plan pickled by :func:`~dataloader.engine.pool.messages.pickle_plan` carries the
    modules of the classes, functions and instances it holds
    (:class:`~dataloader.engine.pool.pickling.PickledPlan`), and the server imports them
    once, with what they import: a worker of torchtitan's pipeline (its tokenizer and
    sample processor, whose modules import torch and ``datasets``) then starts in
    milliseconds instead of importing them again. What a module does on import happens
    once, in the server, rather than in each worker. Not imported: ``__main__`` (the
    user's script: a worker never re-runs it), packages that start runtimes or hold
    connections per process (:data:`NEVER_PRELOAD`), and packages whose import started a
    thread in an earlier server of this process (:data:`THREADED`: a server with a
    thread cannot fork; it says which module started it). Other bytes (a plan pickled elsewhere) preload what they
    name of :data:`PRELOADABLE`, found by one regular-expression pass (0.05 s for 10 MB).
    """
    names = dict.fromkeys(BASE_MODULES)
    if isinstance(plan_bytes, PickledPlan):
        for module in plan_bytes.modules:
            top = module.partition(".")[0]
            if top not in NEVER_PRELOAD and top not in THREADED and module in sys.modules:
                names.setdefault(module)
        return list(names)
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


# The training process's side reads the settings above: imported once they are defined.
from dataloader.engine.pool.zygote.client import ForkedChild, Zygote  # noqa: E402

logger = logging.getLogger("dataloader")


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
    keep the server. A server in which a preloaded module started a thread cannot fork:
    it is replaced too (the next one leaves that module out, see :data:`THREADED`).
    """
    global _shared
    if not ENABLED:
        return None
    env = worker_env()
    key = (sorted(kv for kv in env.items() if kv[0].startswith(IMPORT_SETTINGS)), os.getcwd())
    with _shared_lock:
        server = _shared
        if (server is not None and server.alive and server.owner == os.getpid() and server.key == key
                and server.tainted is None):
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
