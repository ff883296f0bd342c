"""One stream's units on Ray actors: the actors' body and the scheduling loop.

:class:`RayUnits` is the :class:`~dataloader.engine.executor.Executor` that a
:class:`~dataloader.engine.remote.ray_executor.RayExecutor` makes per stream (see that
module for what the user sees). It starts the actors (:class:`UnitActor`), waits for
each to answer ``ready()`` before it sends it units, and runs the pool's
:class:`~dataloader.engine.pool.window.Window` over them: at most ``units_per_worker``
units in flight per actor, the next unit to the least loaded ready actor, results handed
out in unit order. A result that raises ``RayActorError`` or ``ObjectLostError`` means
the actor (or its node) is gone: its units go out again first and another actor starts.
An actor on one unit for ``unit_timeout_s`` is killed and handled the same way. A unit's
time counts from when its actor could start it (sent to an idle actor, or the answer
before it taken in), never earlier, and the answers that have come in are taken in before
any unit is judged: a consumer away for a long training step does not make the units
finished meanwhile look stuck.

When a stream is reset or closed, its actors are told (``UnitActor.drop``, beside the
unit they compute) to skip the units of that stream they have not started, so a
parked actor starts the next stream's first unit after at most the one unit it was
computing (Ray cannot stop a running task of an actor; that answer is dropped).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import socket
import threading
import time
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import cloudpickle

from dataloader.engine.compute import UnitResult, compute_unit, unit_record_keys
from dataloader.engine.plan import Plan
from dataloader.engine.pool.messages import error_payload, remote_error
from dataloader.engine.pool.pickling import dumps_checked
from dataloader.engine.pool.window import Outcome, Window
from dataloader.engine.pool.workers import MAX_CRASHES
from dataloader.errors import LoaderClosedError, WorkerCrashError, WorkerError, WorkerTimeoutError

if TYPE_CHECKING:
    from dataloader.engine.remote.ray_executor import RayExecutor

logger = logging.getLogger("dataloader")

# How long a next() waits on the cluster before it looks at the actors again (scaling,
# start-up timeout, close()).
_POLL_S = 0.25


class _Failed:
    """A unit whose computation raised: the error as :func:`error_payload` makes it."""

    def __init__(self, payload: bytes) -> None:
        self.payload = payload


class UnitActor:
    """The body of one Ray actor: the plan, unpickled once, and units computed on demand."""

    def __init__(self, plan_bytes: bytes, init_fn: bytes, index: int, count: int) -> None:
        self._plan = cloudpickle.loads(plan_bytes)
        self._dropped: set[tuple[str, int]] = set()  # tags of units not to compute
        init = cloudpickle.loads(init_fn)
        if init is not None:  # the loader's worker_init_fn, as in a pool's worker
            init(index, count)

    def ready(self) -> tuple[str, int, str]:
        """Where the actor runs: host name, process id and Ray node id."""
        import ray

        return socket.gethostname(), os.getpid(), ray.get_runtime_context().get_node_id()

    def drop(self, tag: tuple[str, int]) -> None:
        """Units sent with ``tag`` are no longer wanted (their stream was reset or closed).

        Called in the ``"control"`` concurrency group, so it runs while ``compute`` is
        busy: ``ray.cancel`` does not stop an actor task already queued at the actor
        (Ray 2.60 runs it, measured), so the actor skips those units itself (their
        answer is None, dropped by the stream)."""
        self._dropped.add(tag)

    def compute(self, start: int, stop: int, tag: tuple[str, int] | None = None) -> UnitResult | _Failed | None:
        if tag is not None and tag in self._dropped:
            return None  # a unit of a stream since reset or closed: not worth computing
        # passthrough=(): nothing raised here is a Ctrl-C of the training process.
        try:
            result = compute_unit(self._plan, start, stop, passthrough=())
        except BaseException as exc:  # a SystemExit in user code too: the unit's error
            return _Failed(error_payload(exc))
        if result.error is not None:  # cut at a failing record: its error travels along
            result.error = error_payload(result.error)
        return result


@dataclasses.dataclass


class _Actor:
    handle: Any
    index: int
    ready: bool = False
    retiring: bool = False
    local: bool = False


def kill_actors(ray: Any, handles: list[Any]) -> None:
    if not handles or not ray.is_initialized():
        return  # Ray shut down took the actors along (and ray.kill would start a new Ray)
    for handle in handles:
        with contextlib.suppress(Exception):
            ray.kill(handle, no_restart=True)


class RayUnits:
    """Unit results in order, computed by Ray actors (an
    :class:`~dataloader.engine.executor.Executor`; see the module docstring)."""

    def __init__(
        self, spec: RayExecutor, plan: Plan, plan_bytes: bytes, position: int, init_fn: Any = None
    ) -> None:
        self._spec, self._plan, self._ray = spec, plan, spec._ray
        self._plan_bytes, self._plan_ref = plan_bytes, None
        self._init_fn = dumps_checked(init_fn, "worker_init_fn")
        # Parked actors serve a stream with the same plan and the same init_fn only.
        self._digest = hashlib.sha256(plan_bytes + self._init_fn).digest()
        self._window = Window(0, spec.units_per_worker)
        # Units carry (stream, generation): parked actors serve several streams in turn.
        self._stream_id = os.urandom(8).hex()
        self.actors: dict[int, _Actor] = {}
        self._pings: dict[Any, int] = {}  # ready() call -> actor key
        self._refs: dict[Any, int] = {}  # compute() call -> actor key
        self._next_index = 0
        self._start_failures: list[str] = []
        self._closed = False
        # next() runs in the consumer's thread (a device feed's too); close() may come
        # from any other and waits for the next() in progress (a poll: 0.25 s at most).
        self._lock = threading.RLock()
        self._waiting_since: float | None = None  # when no actor was ready any more
        self._handles: list[Any] = []
        self._began: dict[int, float] = {}  # actor key -> when it could start its oldest unit
        self._warned: set[Any] = set()  # units already logged as stalled
        # Actors die with the stream, also when it is dropped without close().
        self._finalizer = weakref.finalize(self, kill_actors, self._ray, self._handles)
        self._window.reset(plan.units(position))
        self._scale()

    def __iter__(self) -> Iterator[UnitResult]:
        return self

    def describe(self) -> dict[str, Any]:
        return {"worker_kind": "ray_actors", "actors": len(self.actors)}

    def reset(self, position: int) -> None:
        """Starts again at ``position``; the actors stay, answers about the old stream
        are dropped when they come."""
        with self._lock:
            self._reset(position)

    def _reset(self, position: int) -> None:
        self._cancel()  # their answers would be dropped: not worth computing
        self._window.reset(self._plan.units(position))
        if self._closed:
            self._closed = False
            self._handles = []
            self._finalizer = weakref.finalize(self, kill_actors, self._ray, self._handles)
        self._scale()

    def __next__(self) -> UnitResult:
        with self._lock:
            return self._next_locked()

    def _next_locked(self) -> UnitResult:
        window = self._window
        while True:
            if self._closed:
                raise LoaderClosedError(
                    "the loader was closed while next() waited for Ray actors; this "
                    "iterator is finished: make a new one (or set_state)"
                )
            self._scale()
            outcome = window.take_head()
            if outcome is not None:
                if outcome.error is not None:
                    raise outcome.error
                self._wait(0)  # keep the actors fed while the consumer works
                self._dispatch()
                return outcome.value
            if window.finished:
                raise StopIteration
            # Answers already in first: a unit whose answer waited while the consumer
            # was away (a long training step) is done, not stuck.
            self._wait(0)
            self._dispatch()
            self._check_start()
            self._check_stalls()
            self._check_timeouts()
            self._wait(_POLL_S)

    def close(self) -> None:
        """Ends the stream: its actors go back to the :class:`RayExecutor` for the next
        stream of the same plan (what they still compute is dropped), those retiring
        are killed (``ray.kill`` returns at once)."""
        if self._closed:
            return
        self._closed = True  # first, unlocked: a next() waiting in another thread stops
        with self._lock:
            self._release()

    def _release(self) -> None:
        self._cancel()  # parked actors must not go on with dropped units
        for actor in self.actors.values():
            if not actor.retiring and self._ray.is_initialized():
                self._spec._park(self._digest + bytes([actor.local]), actor.handle)
                self._handles.remove(actor.handle)
        self._finalizer()
        self.actors.clear()
        self._pings.clear()
        self._refs.clear()

    def _cancel(self) -> None:
        """Tells the actors to skip the units in flight of the current generation that
        they have not started (the running one finishes: Ray cannot stop it without
        killing the actor). Not ``ray.cancel``: in Ray 2.60 it lets an actor task already
        queued at the actor run, and on an actor with concurrency groups it lost the
        actor (measured)."""
        if not self._refs or not self._ray.is_initialized():
            return
        tag = (self._stream_id, self._window.generation)
        for key in {self._refs[ref] for ref in self._refs}:
            if key in self.actors:
                with contextlib.suppress(Exception):  # the actor is gone
                    self.actors[key].handle.drop.options(concurrency_group="control").remote(tag)

    # -- actors ---------------------------------------------------------------------

    def _start_actor(self, local: bool) -> None:
        spec = self._spec
        key = self._next_index
        self._next_index += 1
        handle = spec._unpark(self._digest + bytes([local]))
        if handle is None:
            if self._plan_ref is None:  # in the object store once, for every actor
                self._plan_ref = self._ray.put(self._plan_bytes)
            options: dict[str, Any] = {"num_cpus": spec.num_cpus_per_worker, "max_restarts": 0}
            if local:  # on this node, whatever resources the remote ones ask for
                from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

                node = self._ray.get_runtime_context().get_node_id()
                options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
            else:
                options["resources"] = spec.resources
            count = spec.num_workers + spec.local_workers
            handle = spec._actor_class.options(**options).remote(self._plan_ref, self._init_fn, key, count)
        self._handles.append(handle)
        self.actors[key] = _Actor(handle, key, local=local)
        self._pings[handle.ready.remote()] = key
        self._window.add_worker(key)

    def _scale(self) -> None:
        """Starts or retires actors to ``spec.num_workers``; fits the window to the ready ones."""
        if self._closed:
            return
        for local, wanted in ((True, self._spec.local_workers), (False, self._spec.num_workers)):
            serving = sorted(k for k, a in self.actors.items() if not a.retiring and a.local == local)
            for _ in range(wanted - len(serving)):
                self._start_actor(local)
            for key in serving[wanted:]:
                self.actors[key].retiring = True
        for key, actor in list(self.actors.items()):
            if actor.retiring and not self._window.held(key):
                self._drop(key)
        ready = sum(a.ready and not a.retiring for a in self.actors.values())
        self._window.size = ready * self._spec.units_per_worker
        if ready:
            self._waiting_since = None
        elif self._waiting_since is None:
            self._waiting_since = time.monotonic()

    def _drop(self, key: int) -> None:
        """Kills an actor and forgets it (its units must have been handled)."""
        actor = self.actors.pop(key)
        kill_actors(self._ray, [actor.handle])
        with contextlib.suppress(ValueError):
            self._handles.remove(actor.handle)
        with contextlib.suppress(KeyError):
            self._window.remove_worker(key)
        for ref in [r for r, k in self._pings.items() if k == key]:
            del self._pings[ref]

    def _died(self, key: int, timed_out: float | None = None) -> None:
        """An actor is lost (or was killed after ``timed_out`` seconds on one unit): its
        units go out again first, another actor takes its place."""
        if key not in self.actors:
            return
        index = self.actors[key].index
        tokens, poisoned = self._window.worker_died(key, MAX_CRASHES)
        for ref in tokens:
            self._refs.pop(ref, None)
        for unit in poisoned:
            start, stop = self._window.range(unit)
            if timed_out is not None:
                error: WorkerError = WorkerTimeoutError(
                    f"positions [{start}, {stop}) were computed for more than "
                    f"unit_timeout_s={self._spec.unit_timeout_s:g} s by {MAX_CRASHES} Ray "
                    f"actors in turn (the last was actor {index}, killed); a record there "
                    f"hangs its operation (look at the actors' logs), or raise unit_timeout_s",
                    operation="unknown (in a Ray actor)",
                    record_indices=unit_record_keys(self._plan, start, stop).tolist(),
                    position=start, worker=index,
                )
            else:
                error = WorkerCrashError(
                    f"positions [{start}, {stop}) were being computed by {MAX_CRASHES} Ray "
                    f"actors that died (the last was actor {index}); a record there may "
                    f"crash its process (look at the actors' logs), or the nodes were lost"
                )
            self._window.finish(unit, Outcome(None, error))
        self._began.pop(key, None)
        self._drop(key)
        if timed_out is not None:
            logger.warning(
                "granary: Ray actor %d computed one unit for %.0f s (unit_timeout_s): killed; "
                "its units go to the other actors", index, timed_out,
            )
        else:
            logger.warning("granary: Ray actor %d was lost; its units go to the other actors", index)
        self._scale()

    def _check_start(self) -> None:
        """Fails a stream that has had no ready actor for ``start_timeout_s``."""
        if self._waiting_since is None:
            return
        waited = time.monotonic() - self._waiting_since
        if waited < self._spec.start_timeout_s:
            return
        spec = self._spec
        try:
            available = self._ray.available_resources()
        except Exception:  # only for the message
            available = "unknown"
        self.close()
        raise WorkerError(
            f"no Ray actor became ready in {waited:.0f}s: each asks for "
            f"{spec.num_cpus_per_worker} CPU and resources {spec.resources}, and the cluster "
            f"has {available} available; add nodes with those resources, lower "
            f"num_cpus_per_worker/resources, or raise start_timeout_s"
        )

    # -- dispatching and receiving --------------------------------------------------

    def _dispatch(self) -> None:
        window = self._window
        ready = [k for k, a in self.actors.items() if a.ready and not a.retiring]
        while ready and (key := window.pick_worker(ready)) is not None:
            unit = window.next_unit()
            if unit is None:
                return
            start, stop = window.range(unit)
            ref = self.actors[key].handle.compute.remote(start, stop, (self._stream_id, window.generation))
            if window.current(key) is None:
                self._began[key] = time.monotonic()  # an idle actor starts on it now
            window.sent(key, unit, ref)
            self._refs[ref] = key

    def _check_stalls(self) -> None:
        """Logs, once per unit, an actor that has computed one unit for
        ``stall_warning_s`` (its oldest unit, counted from when it could start it)."""
        limit = self._spec.stall_warning_s
        if limit is None:
            return
        now = time.monotonic()
        for key, began in list(self._began.items()):
            entry = self._window.current(key)
            if entry is None or entry.generation != self._window.generation:
                continue  # idle, or on a unit of a stream before reset()
            if now - began < limit or entry in self._warned:
                continue
            self._warned.add(entry)
            start, stop = self._window.range(entry.unit)
            logger.warning(
                "granary: Ray actor %d has computed unit %d (positions [%d, %d), records %s) "
                "for %.0f s; look at its log (ray logs), or lower the work per record",
                self.actors[key].index, entry.unit, start, stop,
                unit_record_keys(self._plan, start, stop)[:8].tolist(), now - began,
            )

    def _check_timeouts(self) -> None:
        """Kills an actor that has computed one unit for ``unit_timeout_s`` (whatever
        stream the unit is of: a hung actor serves none); its units go out again."""
        limit = self._spec.unit_timeout_s
        if limit is None:
            return
        now = time.monotonic()
        for key, began in list(self._began.items()):
            if key in self.actors and self._window.current(key) is not None and now - began >= limit:
                self._died(key, timed_out=now - began)  # _drop kills it: ray.kill

    def _wait(self, timeout: float) -> None:
        """Takes in every answer ready within ``timeout`` seconds (0: those ready now)."""
        ray = self._ray
        waiting = [*self._pings, *self._refs]
        if not waiting:
            if timeout:
                time.sleep(timeout)  # actors are being started or replaced
            return
        done, _ = ray.wait(waiting, num_returns=1, timeout=timeout)
        if not done:
            return
        done, _ = ray.wait(waiting, num_returns=len(waiting), timeout=0)
        finished = set(done)
        for ref in [r for r in done if r in self._pings]:
            self._pinged(ref)
        for key in list(self.actors):
            # An actor answers in the order it was sent units, and the window pops in
            # that order: take this actor's answers from its oldest while they are in.
            while key in self.actors:
                entry = self._window.current(key)
                if entry is None or entry.token not in finished:
                    break
                self._receive(key, entry)

    def _pinged(self, ref: Any) -> None:
        key = self._pings.pop(ref)
        try:
            self._ray.get(ref)
        except self._ray.exceptions.RayError as exc:
            self._start_failures.append(str(exc))
            if len(self._start_failures) >= MAX_CRASHES:
                self.close()
                raise WorkerError(
                    f"{MAX_CRASHES} Ray actors in a row could not start; the last said:\n"
                    f"{self._start_failures[-1]}\n(the plan must unpickle on the nodes: "
                    f"granary and the pipeline's modules must be importable there, e.g. "
                    f"through init_kwargs={{'runtime_env': ...}})"
                ) from None
            self._died(key)
            return
        self._start_failures.clear()
        if key in self.actors:
            self.actors[key].ready = True
            self._scale()

    def _receive(self, key: int, entry: Any) -> None:
        ray, window = self._ray, self._window
        began = time.perf_counter()
        try:
            value = ray.get(entry.token)
        except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError):
            self._died(key)  # the actor, its node, or the node holding the result is gone
            return
        except ray.exceptions.RayError as exc:  # e.g. a result Ray could not serialize
            value = _Failed(error_payload(WorkerError(
                f"Ray could not return unit {entry.unit} from actor "
                f"{self.actors[key].index}: {exc}"
            )))
        window.answered(key, entry.generation, entry.unit)
        self._refs.pop(entry.token, None)
        self._warned.discard(entry)
        self._began[key] = time.monotonic()  # it starts on its next unit, if any
        index = self.actors[key].index
        if entry.generation != window.generation:
            pass  # an answer about a stream before reset(): dropped
        elif isinstance(value, _Failed):
            window.finish(entry.unit, Outcome(None, remote_error(value.payload, index)))
        else:
            value.worker = index
            value.timings["transport"] = time.perf_counter() - began
            if value.error is not None:
                value.error = remote_error(value.error, index)
            window.finish(entry.unit, Outcome(value))
        if self.actors[key].retiring and not window.held(key):
            self._drop(key)
