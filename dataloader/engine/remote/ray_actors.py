"""Ray actors as a worker set: the :class:`~dataloader.engine.pool.workers.Workers` of a cluster.

The pool's one scheduling loop (:class:`~dataloader.engine.pool.executor.PoolExecutor`)
runs a :class:`~dataloader.engine.remote.ray_executor.RayExecutor`'s streams as it runs
processes and threads: the window, the order, the balancing, the retries and the stall
watch are the loop's. What Ray changes is how a unit reaches a worker and comes back:

* a worker is an actor (:class:`UnitActor`); it is started when created, and ready once
  its first ``ready()`` call answers (an actor that cannot start, ``MAX_CRASHES`` times in
  a row, or no actor ready for ``start_timeout_s``, is the loop's ``Fatal``);
* a unit sent is an ``ObjectRef`` of ``compute()``; :meth:`RayActors.events` is a
  ``ray.wait`` over the refs in flight, within the loop's timeout, and hands each actor's
  answers over in the order it was sent them;
* a ref that raises ``RayActorError`` or ``ObjectLostError`` means the actor, or its
  node, is gone: the worker died, and the loop sends its units out again;
* the ``board`` says when an actor could start its oldest unit: when it was sent to an
  idle actor, or when the answer before it came in. A consumer away for a long training
  step therefore never makes a unit look stuck (the loop takes the answers in first);
* a unit past ``unit_timeout_s`` kills its actor, and is computed again by another
  (``retries_stuck``: another node may well succeed) until ``MAX_CRASHES`` actors in turn
  timed out on it.

When a stream is reset or closed, its actors are told (``UnitActor.drop``) to skip the
units of the old stream they have not started (Ray cannot stop a running actor task). A
closed stream's actors are parked on the ``RayExecutor`` for its next stream of the plan.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from dataloader.engine.compute import UnitResult
from dataloader.engine.pool.messages import Done, Failed, Fatal, Ready, error_payload, remote_error
from dataloader.engine.pool.watch.progress import ELSEWHERE, IDLE, Position
from dataloader.engine.pool.window import Window
from dataloader.engine.pool.workers import MAX_CRASHES, Closing, Slots, Workers
from dataloader.engine.remote.unit_actor import Raised, RayActor, kill_actors, new_actor
from dataloader.errors import WorkerError

if TYPE_CHECKING:
    from dataloader.engine.remote.ray_executor import RayExecutor

class RayActors(Slots):
    """The actors of one stream (see the module docstring).

    Args:
        spec: the :class:`RayExecutor` (its settings, its parked actors).
        plan_bytes: the pickled plan, put in the object store once for every actor.
        init_fn: the pickled ``worker_init_fn``.
    """

    kind = "ray_actors"
    handover = None
    retries_stuck = True  # another actor, maybe on another node, computes it again
    stop_words = f"the actor was killed (it was the last of {MAX_CRASHES} actors in turn to time out on it)"
    stop_verb = "killing the actor; its units go to the other actors"

    def __init__(self, slots: int, spec: RayExecutor, plan_bytes: bytes, init_fn: bytes) -> None:
        super().__init__(slots)
        self._spec, self._ray = spec, spec.ray
        self._plan_bytes, self._plan_ref, self._init_fn = plan_bytes, None, init_fn
        # Parked actors serve a stream with the same plan and the same init_fn only.
        self._digest = hashlib.sha256(plan_bytes + init_fn).digest()
        self._stream = os.urandom(8).hex()  # parked actors serve several streams in turn
        self._generation = 0  # the newest stream generation sent
        self._start_failures: list[str] = []
        self._waiting_since: float | None = time.monotonic()  # no actor ready since then

    @property
    def board(self) -> RayActors:
        """The set is its own board (:meth:`read`). A property, not ``self.board = self``:
        that cycle kept a dropped stream, its executor and the executor's parked actors
        alive until the next full garbage collection, instead of ending them at once."""
        return self

    def describe(self) -> dict[str, Any]:
        return {"worker_kind": "ray_actors", "actors": len(self.workers)}

    def handles(self) -> list[Any]:
        return [w.handle for w in self.workers]

    # -- starting -------------------------------------------------------------------------

    def _spawn(self, index: int) -> RayActor:
        if self.stopping:
            raise Closing("the loader was closed while a Ray actor was starting")
        local = index < self._spec.local_workers  # local actors take the lowest slots
        handle = self._spec.unpark(self._digest + bytes([local]))
        if handle is None:
            if self._plan_ref is None:  # in the object store once, for every actor
                self._plan_ref = self._ray.put(self._plan_bytes)
            handle = new_actor(self._spec, index, local, self._plan_ref, self._init_fn)
        return RayActor(index, handle, local, handle.ready.remote())

    def add(self, count: int) -> Iterator[RayActor]:
        """Starts ``count`` more actors in the free slots, lowest first (no upper bound)."""
        used = {w.index for w in self.workers}
        for index in itertools.islice((i for i in itertools.count() if i not in used), count):
            yield self._join(self._spawn(index))

    # -- units ----------------------------------------------------------------------------

    def send(self, w: RayActor, generation: int, unit: int, start: int, stop: int, blocks_needed: int) -> None:
        if generation != self._generation:
            self._drop_old(generation)
            self._generation = generation
        if not w.inflight:
            w.began_ns = time.monotonic_ns()  # an idle actor starts on it now
        w.inflight.append((generation, unit, w.handle.compute.remote(start, stop, (self._stream, generation))))

    def _drop_old(self, keep: int | None) -> None:
        """Tells each actor to skip the units it holds of generations other than ``keep``."""
        if not self._ray.is_initialized():
            return
        for w in self.workers:
            for generation in {g for g, _, _ in w.inflight if g != keep}:
                with contextlib.suppress(Exception):  # the actor is gone
                    w.handle.drop.options(concurrency_group="control").remote((self._stream, generation))

    def give_back(self, token: Any) -> None:
        """Nothing was lent: results live in the object store."""

    def result(self, w: RayActor, token: Any, message: Any, nbytes: int, blocks_needed: int) -> UnitResult:
        value: UnitResult = message.result
        value.worker = w.index
        if value.error is not None:
            value.error = remote_error(value.error, w.index)
        return value

    def error(self, w: RayActor, payload: Any) -> Exception:
        return remote_error(payload, w.index)

    def note_local_result(self, result: UnitResult, blocks_needed: int) -> None:
        """No blocks to size."""

    def read(self, index: int) -> Position:
        """The board: the oldest unit of the actor in slot ``index`` and when it could start."""
        for w in self.workers:
            if w.index == index and w.inflight:
                generation, unit, _ = w.inflight[0]
                return Position(generation, unit, ELSEWHERE, w.began_ns)
        return Position(-1, 0, IDLE, 0)

    # -- listening ------------------------------------------------------------------------

    def _refs(self) -> list[Any]:
        return [r for w in list(self.workers) for r in ([w.ping] if w.ping else []) + [t[2] for t in w.inflight]]

    def wait_readable(self, timeout: float) -> None:
        with contextlib.suppress(RuntimeError):  # the set changed under this (unlocked) look
            refs = self._refs()
            if refs:
                self._ray.wait(refs, num_returns=1, timeout=timeout, fetch_local=False)
                return
        time.sleep(timeout)

    def events(self, timeout: float) -> Iterator[tuple[RayActor, Any, int]]:
        """What came in within ``timeout`` seconds: pings (``Ready``, or a death), then
        each actor's answers from its oldest while they are in."""
        ray = self._ray
        if not any(w.ready for w in self.live()):
            late = self._late()
            if late is not None:
                yield late
                return
        refs = self._refs()
        if not refs:
            if timeout:
                time.sleep(timeout)  # actors are being started or replaced
            return
        # fetch_local=False: in once its task ended (else the transfer counts as compute)
        if not ray.wait(refs, num_returns=1, timeout=timeout, fetch_local=False)[0]:
            return
        done = set(ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)[0])
        for w in list(self.workers):
            if w.ping is not None and w.ping in done:
                yield from self._pinged(w)
            while not w.gone and w.inflight and w.inflight[0][2] in done:
                generation, unit, ref = w.inflight.popleft()
                w.began_ns = time.monotonic_ns()  # it starts on its next unit, if any
                began = time.perf_counter()
                try:
                    value = ray.get(ref)
                except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError):
                    w.inflight.appendleft((generation, unit, ref))  # still the loop's
                    yield w, None, 0  # the actor, its node, or the node holding the result is gone
                    break
                except ray.exceptions.RayError as exc:  # e.g. a result Ray could not serialize
                    value = Raised(error_payload(WorkerError(
                        f"Ray could not return unit {unit} from actor {w.index}: {exc}")))
                if isinstance(value, Raised):
                    yield w, Failed(generation, unit, value.payload), 0
                elif value is None:  # skipped by the actor: a unit of an old generation
                    yield w, Failed(generation, unit, error_payload(WorkerError(f"unit {unit} was dropped"))), 0
                else:
                    value.timings["transport"] = time.perf_counter() - began
                    yield w, Done(generation, unit, None, 0, value), 0

    def _pinged(self, w: RayActor) -> Iterator[tuple[RayActor, Any, int]]:
        ref, w.ping = w.ping, None
        try:
            w.host, w.pid, _ = self._ray.get(ref)
        except self._ray.exceptions.RayError as exc:
            self._start_failures.append(str(exc))
            if len(self._start_failures) >= MAX_CRASHES:
                yield w, Fatal(
                    f"{MAX_CRASHES} Ray actors in a row could not start; the last said:\n"
                    f"{self._start_failures[-1]}\n(the plan must unpickle on the nodes: "
                    f"granary and the pipeline's modules must be importable there, e.g. "
                    f"through init_kwargs={{'runtime_env': ...}})"), 0
            else:
                yield w, None, 0
            return
        self._start_failures.clear()
        self._waiting_since = None
        yield w, Ready(w.pid), 0

    def _late(self) -> tuple[RayActor, Fatal, int] | None:
        """A ``Fatal`` when no actor has been ready for ``start_timeout_s``."""
        now = time.monotonic()
        if self._waiting_since is None:
            self._waiting_since = now
        waited = now - self._waiting_since
        starting = [w for w in self.workers if not w.ready]
        if waited < self._spec.start_timeout_s or not starting:
            return None
        spec = self._spec
        try:
            available = self._ray.available_resources()
        except Exception:  # only for the message
            available = "unknown"
        return starting[0], Fatal(
            f"no Ray actor became ready in {waited:.0f}s: each asks for "
            f"{spec.num_cpus_per_worker} CPU and resources {spec.resources}, and the cluster "
            f"has {available} available; add nodes with those resources, lower "
            f"num_cpus_per_worker/resources, or raise start_timeout_s"), 0

    # -- ending ---------------------------------------------------------------------------

    def kill(self, w: RayActor) -> None:
        kill_actors(self._ray, [w.handle])

    def bury(self, w: RayActor, timed_out: bool) -> int:
        """Forgets a lost (or killed) actor; its units are the loop's to send again."""
        w.gone = True
        w.inflight.clear()
        self.kill(w)
        return 0

    def stop(self, w: RayActor) -> None:
        """A retiring actor that holds no unit: killed."""
        w.gone = True
        self.kill(w)
        self.workers.remove(w)

    def reap_retired(self) -> None:
        """Nothing to reap: ``ray.kill`` ends an actor."""

    def close(self) -> None:
        """After the pool's ``close()``: parks the actors on the executor for its next
        stream of this plan (told to skip what they hold of this one; a starting one
        answers that stream's ping) and kills the retiring ones. When the stream was
        garbage collected or ended by an error: kills them all (the executor may be
        collected first, and its parked actors with it)."""
        park = self.stopping  # set by the pool's close(); else collected, or an error
        self.stopping = True
        self._drop_old(None)
        doomed = []
        for w in self.workers:
            if park and not (w.gone or w.retiring) and self._ray.is_initialized():  # ready or starting
                self._spec.park(self._digest + bytes([w.local]), w.handle)
            else:
                doomed.append(w.handle)
            w.gone = True
        kill_actors(self._ray, doomed)
        self.workers.clear()

    def worker_bytes(self) -> int:
        return 0

    def footprint(self) -> tuple[int, int, int, int | None]:
        """An actor costs this machine nothing (or is placed by Ray where it fits)."""
        return 0, 0, 0, None


class Follow:
    """The actor count of a stream follows its executor's (``RayExecutor.scale(n)``): the
    loop's :class:`~dataloader.engine.pool.autoscale.changes.Decider`."""

    def __init__(self, spec: RayExecutor) -> None:
        self._spec = spec

    def decide(self, now: float, workers: Workers, window: Window) -> int:
        return self._spec.num_workers + self._spec.local_workers - len(workers.live())

    def waited(self, seconds: float) -> None:
        """The count is the user's to choose (the advice reads the waits from stats)."""

    def refused(self, started: int) -> None:
        """Ray places actors where they fit, or reports them late (``start_timeout_s``)."""
