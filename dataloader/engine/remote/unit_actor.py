"""One Ray actor that computes units: its body (:class:`UnitActor`), how it starts and
ends, and how the scheduling loop sees it (:class:`RayActor`).

An actor unpickles the plan once (the very bytes the local pool sends its processes),
runs the loader's ``worker_init_fn``, and computes units with
:func:`~dataloader.engine.compute.compute_unit`, so sources open lazily on the remote node
and every unit is what the training process would have computed. Its errors travel as
:func:`~dataloader.engine.pool.messages.error_payload` bytes, as a worker process's do.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import os
import socket
from typing import TYPE_CHECKING, Any

import cloudpickle

from dataloader.engine.compute import UnitResult, compute_unit
from dataloader.engine.pool.messages import error_payload

if TYPE_CHECKING:
    from dataloader.engine.remote.ray_executor import RayExecutor

_KEYS = itertools.count()


class Raised:
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
        (Ray 2.60 runs it, measured), so the actor skips those units itself."""
        self._dropped.add(tag)

    def compute(self, start: int, stop: int, tag: tuple[str, int] | None = None) -> UnitResult | Raised | None:
        if tag is not None and tag in self._dropped:
            return None  # a unit of a stream since reset or closed: its answer is dropped
        # passthrough=(): nothing raised here is a Ctrl-C of the training process.
        try:
            result = compute_unit(self._plan, start, stop, passthrough=())
        except BaseException as exc:  # a SystemExit in user code too: the unit's error
            return Raised(error_payload(exc))
        if result.error is not None:  # cut at a failing record: its error travels along
            result.error = error_payload(result.error)
        return result


def kill_actors(ray: Any, handles: list[Any]) -> None:
    if not handles or not ray.is_initialized():
        return  # Ray shut down took the actors along (and ray.kill would start a new Ray)
    for handle in handles:
        with contextlib.suppress(Exception):
            ray.kill(handle, no_restart=True)


def new_actor(spec: RayExecutor, index: int, local: bool, plan_ref: Any, init_fn: bytes) -> Any:
    """Starts the actor of slot ``index``: on this node (``local``), whatever resources the
    remote ones ask for, else wherever ``spec.resources`` are."""
    options: dict[str, Any] = {"num_cpus": spec.num_cpus_per_worker, "max_restarts": 0}
    if local:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        node = spec.ray.get_runtime_context().get_node_id()
        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
    else:
        options["resources"] = spec.resources
    count = spec.num_workers + spec.local_workers
    return spec.actor_class.options(**options).remote(plan_ref, init_fn, index, count)


class RayActor:
    """One actor as the loop sees it: its slot, its handle, the units it was sent."""

    def __init__(self, index: int, handle: Any, local: bool, ping: Any) -> None:
        self.index, self.key = index, next(_KEYS)
        self.handle, self.local, self.ping = handle, local, ping
        self.ready = self.retiring = self.gone = False
        self.pid, self.host = -1, "?"
        self.inflight: collections.deque[tuple[int, int, Any]] = collections.deque()  # (generation, unit, ref)
        self.began_ns = 0  # when it could start its oldest unit

    @property
    def where(self) -> str:
        return f"Ray actor, pid {self.pid} on {self.host}"
