"""Units computed by Ray actors on a cluster, handed back in unit order.

:class:`RayExecutor` is what a user passes (``DataLoader(..., executor=RayExecutor(...))``):
it connects to the cluster when it is made (so a cluster that cannot be reached fails
there) and makes one stream per iterator: the pool's scheduling loop
(:class:`~dataloader.engine.pool.executor.PoolExecutor`) over a worker set of Ray actors
(:class:`~dataloader.engine.remote.ray_actors.RayActors`). It starts ``num_workers``
actors; each unpickles the plan once (the very bytes the local pool
sends its processes, put in the object store once) and computes units with
:func:`~dataloader.engine.compute.compute_unit`, so sources open lazily on the remote
node and every unit is what the training process would have computed. Results come
back through Ray's object store: numpy buffers travel out of band and arrive as
read-only views of the store, without a copy (as Ray Data hands its batches out).

Scheduling is the local pool's, written once
(:class:`~dataloader.engine.pool.window.Window` and its loop): at most
``units_per_worker`` units in flight per actor, new units to the least loaded ready
actor (dynamic balancing), results kept until the consumer reaches them and handed out
in unit order, never more than ``num_workers * units_per_worker`` units ahead of it.
An actor that dies (``ray.kill``, its node removed, its process killed) takes nothing
with it: its units go out again to the others, first, and a new actor is started in
its place. A unit that was the oldest of ``MAX_CRASHES`` dead actors becomes a
:class:`~dataloader.errors.WorkerCrashError` at its place. Because a unit is a pure
function of its range, none of this changes a batch or the state.
"""

from __future__ import annotations

import contextlib
import socket
import weakref
from collections.abc import Mapping
from typing import Any

from dataloader.engine.plan import Plan
from dataloader.engine.pool.executor import PoolExecutor
from dataloader.engine.pool.pickling import dumps_checked
from dataloader.engine.remote.ray_actors import Follow, RayActors
from dataloader.engine.remote.unit_actor import UnitActor, kill_actors
from dataloader.options import DEFAULT_STALL_WARNING_S, check_seconds

# A host:port that does not accept a TCP connection within this is reported unreachable
# (ray.init itself retries for about a minute before it gives up).
_CONNECT_TIMEOUT_S = 5.0


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ImportError(
            "RayExecutor needs Ray, which is not installed; install it with "
            "pip install 'granary[ray]' (or pip install ray)"
        ) from exc
    return ray


def _check_reachable(address: str) -> None:
    """A clear error when ``host:port`` (or ``ray://host:port``) accepts no connection."""
    hostport = address.removeprefix("ray://")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(
            f"RayExecutor address {address!r} is not host:port; expected None (start a "
            f"local Ray), 'auto' (the cluster this machine belongs to), 'host:port' (the "
            f"head node's GCS address that `ray start --head` prints) or 'ray://host:port' "
            f"(Ray Client)"
        )
    try:
        with socket.create_connection((host, int(port)), timeout=_CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        raise ConnectionError(
            f"no Ray cluster answers at address {address!r} ({exc}); expected the head "
            f"node's address as `ray start --head` prints it; start the cluster (ray start "
            f"--head), fix the address, or pass address=None to start Ray on this machine"
        ) from None


class RayExecutor:
    """Computes the loader's units on Ray actors; pass it as ``DataLoader(executor=...)``.

    The batches and the states are the same as with ``worker_count=0`` or the local
    pool, so a state saved with one restores with the other. User code runs on the
    actors only.

    Args:
        address: None: the Ray this process already joined (``ray.init`` called
            before), else a new local one (or ``RAY_ADDRESS``); ``"auto"``: the cluster
            this machine belongs to; ``"host:port"``: the head node's address;
            ``"ray://host:port"``: through Ray Client.
        num_workers: actors computing units (change it while iterating with
            :meth:`scale`).
        num_cpus_per_worker: the CPUs Ray reserves for each actor.
        resources: custom resources each actor needs, e.g. ``{"data_node": 1}`` to keep
            them off the training hosts.
        units_per_worker: units in flight per actor (the pool's ``worker_buffer_size``).
        start_timeout_s: a stream whose actors none could start (no node has the
            resources) fails after this many seconds, naming what it asked for.
        init_kwargs: more keyword arguments of ``ray.init`` (``runtime_env`` to ship
            code to the nodes, ``namespace``, ...), when this executor calls it.
        local_workers: more actors, on this process's own node (the training host's
            CPUs), beside the ``num_workers`` placed by ``resources``: a free actor
            takes the next unit wherever it runs, so the remote ones take what the
            local ones cannot keep up with.
        stall_warning_s: log a warning (logger ``"dataloader"``, once per unit) naming
            the actor, the unit and its records when an actor has computed one unit
            for this long (None: never).
        unit_timeout_s: an actor that has computed one unit this long is killed and
            replaced, and its units go to the other actors (a hung read on one node,
            a wedged decoder); a unit that timed out on ``MAX_CRASHES`` actors becomes
            a :class:`~dataloader.WorkerTimeoutError` at its place (the local pool's
            ``unit_timeout_s`` does not retry: its workers share one machine, while
            here another node may well succeed). None (the default): never.

    Raises:
        ConnectionError: no cluster answers at ``address`` (nothing is left running).
        ValueError: a setting out of range (named).

    Example (needs Ray; starts a local one)::

        loader = dl.DataLoader(source, sampler, ops,
                               executor=dl.RayExecutor(address="auto", num_workers=8))
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        num_workers: int = 2,
        num_cpus_per_worker: float = 1.0,
        resources: Mapping[str, float] | None = None,
        units_per_worker: int = 2,
        start_timeout_s: float = 120.0,
        init_kwargs: Mapping[str, Any] | None = None,
        local_workers: int = 0,
        stall_warning_s: float | None = DEFAULT_STALL_WARNING_S,
        unit_timeout_s: float | None = None,
    ) -> None:
        if address is not None and not isinstance(address, str):
            raise TypeError(f"RayExecutor address must be a string or None, got {address!r}")
        self.num_workers = _count("num_workers", num_workers, 0)
        self.local_workers = _count("local_workers", local_workers, 0)
        if not self.num_workers + self.local_workers:
            raise ValueError(
                "RayExecutor needs at least one actor: num_workers and local_workers are "
                "both 0; pass num_workers >= 1"
            )
        self.units_per_worker = _count("units_per_worker", units_per_worker, 1)
        if isinstance(num_cpus_per_worker, bool) or not isinstance(num_cpus_per_worker, (int, float)) \
                or num_cpus_per_worker < 0:
            raise ValueError(f"num_cpus_per_worker must be a number >= 0, got {num_cpus_per_worker!r}")
        self.num_cpus_per_worker = float(num_cpus_per_worker)
        resources = dict(resources or {})
        for name, amount in resources.items():
            if not isinstance(name, str) or isinstance(amount, bool) or not isinstance(amount, (int, float)) \
                    or amount < 0:
                raise ValueError(
                    f"resources must map resource names to amounts >= 0, got {name!r}: {amount!r}"
                )
        self.resources = resources
        if isinstance(start_timeout_s, bool) or not isinstance(start_timeout_s, (int, float)) \
                or start_timeout_s <= 0:
            raise ValueError(f"start_timeout_s must be a positive number of seconds, got {start_timeout_s!r}")
        self.start_timeout_s = float(start_timeout_s)
        self.stall_warning_s = check_seconds("stall_warning_s", stall_warning_s)
        self.unit_timeout_s = check_seconds("unit_timeout_s", unit_timeout_s)
        self.address = address
        self._runs: weakref.WeakSet[RayActors] = weakref.WeakSet()
        self.ray = _import_ray()
        self._connect(dict(init_kwargs or {}))
        # compute() one unit at a time (the default group); drop() runs beside it.
        self.actor_class = self.ray.remote(concurrency_groups={"control": 1})(UnitActor)
        # Actors of finished streams, kept for the next stream of the same plan (its
        # first batch then costs no actor start-up): (plan digest, handle). A stream of
        # another plan that has to start an actor ends them (see unpark).
        self._parked: list[tuple[bytes, Any]] = []
        self._finalizer = weakref.finalize(self, _kill_parked, self.ray, self._parked)

    def _connect(self, init_kwargs: dict[str, Any]) -> None:
        ray, address = self.ray, self.address
        if address not in (None, "auto"):
            _check_reachable(address)  # also when Ray runs here: the user named a cluster
        if ray.is_initialized():
            return
        try:
            ray.init(address=address, **init_kwargs)
        except Exception as exc:
            with contextlib.suppress(Exception):
                ray.shutdown()  # whatever the failed start left running
            if address == "auto":
                raise ConnectionError(
                    f"RayExecutor(address='auto') found no Ray cluster on this machine "
                    f"({type(exc).__name__}: {exc}); expected one started with `ray start "
                    f"--head`; start it, pass its address, or pass address=None to start "
                    f"Ray here"
                ) from None
            raise ConnectionError(
                f"RayExecutor could not join Ray at address {address!r}: "
                f"{type(exc).__name__}: {exc}; check that the cluster runs the same Ray "
                f"and Python versions, or pass address=None to start Ray here"
            ) from exc

    def scale(self, num_workers: int) -> None:
        """Sets the number of actors placed by ``resources``; running streams start or
        retire actors at their next ``next()`` (a retiring actor first answers the units
        it holds)."""
        self.num_workers = _count("num_workers", num_workers, 0 if self.local_workers else 1)

    def close(self) -> None:
        """Kills the actors kept between streams (also done when the executor is
        garbage collected or Ray shuts down); running streams keep theirs."""
        self._finalizer()
        self._finalizer = weakref.finalize(self, _kill_parked, self.ray, self._parked)

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def park(self, digest: bytes, handle: Any) -> None:
        """Keeps a closed stream's actor for the next stream of its plan (``digest``)."""
        self._parked.append((digest, handle))

    def unpark(self, digest: bytes) -> Any:
        """A parked actor for ``digest`` (plan digest + locality byte), or None: then the
        caller starts one, and the parked actors of other plans are killed first, since
        they may hold the CPUs it needs (a fingerprint check's actors, of a plan of its
        own, would otherwise keep the restored stream's actors from ever starting on a
        full cluster)."""
        for i, (d, handle) in enumerate(self._parked):
            if d == digest:
                del self._parked[i]
                return handle
        others = [handle for d, handle in self._parked if d[:-1] != digest[:-1]]
        if others:
            self._parked[:] = [(d, h) for d, h in self._parked if d[:-1] == digest[:-1]]
            kill_actors(self.ray, others)
        return None

    def describe(self) -> dict[str, Any]:
        """What ``stats()["pipeline"]["executor"]`` says of it (the counts when the
        loader was built; the advice reads them): kind, actors, where they run."""
        return {
            "kind": "ray",
            "actors": self.num_workers + self.local_workers,
            "remote_actors": self.num_workers,
            "local_actors": self.local_workers,
            "units_per_worker": self.units_per_worker,
            "num_cpus_per_worker": self.num_cpus_per_worker,
            "resources": dict(self.resources),
        }

    def actors(self) -> list[Any]:
        """The live actor handles of every running stream (to watch them, or to kill one
        in a fault drill: ``ray.kill(handle)`` loses no unit)."""
        return [handle for run in list(self._runs) for handle in run.handles()]

    def make_executor(
        self, plan: Plan, plan_bytes: bytes, position: int, init_fn: Any = None
    ) -> PoolExecutor:
        """A stream of the plan's units from ``position`` (what the loader calls);
        ``init_fn(actor_index, actor_count)`` runs once in each actor."""
        init = dumps_checked(init_fn, "worker_init_fn")

        def actors(slots: int) -> RayActors:
            run = RayActors(slots, self, plan_bytes, init)
            self._runs.add(run)
            return run

        return PoolExecutor(
            plan, plan_bytes, position, worker_count=self.num_workers + self.local_workers,
            buffer_size=self.units_per_worker, stall_warning_s=self.stall_warning_s,
            unit_timeout_s=self.unit_timeout_s, make_workers=actors, scaling=Follow(self),
        )

    def __repr__(self) -> str:
        return (
            f"RayExecutor(address={self.address!r}, num_workers={self.num_workers}, "
            f"num_cpus_per_worker={self.num_cpus_per_worker}, resources={self.resources})"
        )


def _count(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


def _kill_parked(ray: Any, parked: list[tuple[bytes, Any]]) -> None:
    kill_actors(ray, [handle for _, handle in parked])
    parked.clear()
