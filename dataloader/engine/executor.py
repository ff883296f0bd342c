"""Executors: what computes a stream's units and hands their results over in unit order.

:class:`Executor` is the interface the iterator reads, and :class:`ExecutorMaker` makes
the executors of the kind a loader chose.
:class:`~dataloader.engine.in_process.InProcessExecutor` computes units in the training
process (``worker_count=0``, optionally with read-ahead threads),
:class:`~dataloader.engine.pool.executor.PoolExecutor` in worker processes or threads,
and a :class:`~dataloader.engine.remote.ray_executor.RayExecutor`'s streams on Ray
actors. Each computes a unit with the same function
(:func:`~dataloader.engine.compute.compute_unit`), so the output never depends on which
one runs it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol, runtime_checkable

from dataloader.engine.compute import UnitResult
from dataloader.engine.plan import Plan


class Executor(Protocol):
    """Unit results of one stream, in unit order.

    ``next()`` returns the next unit's :class:`UnitResult` (or raises the error of the
    unit, at its place in the stream); ``StopIteration`` ends the stream.
    """

    def __iter__(self) -> Iterator[UnitResult]: ...

    def __next__(self) -> UnitResult: ...

    def reset(self, position: int) -> None:
        """Starts the stream again at local ``position``; work in flight is dropped."""

    def describe(self) -> dict[str, Any]:
        """What computes the units, for ``stats()["pipeline"]["workers"]`` (plain JSON
        values; a pool: ``{"worker_kind": "processes" | "threads" | "auto", ...}``)."""

    def close(self) -> None:
        """Stops all background work and frees its resources; idempotent.

        Callable from any thread, and returns in bounded time (seconds) even while a
        ``next()`` waits in another thread; that ``next()`` then raises
        :class:`~dataloader.errors.LoaderClosedError` (or returns a result it had).
        """


@runtime_checkable
class Prefetching(Protocol):
    """An executor that computes nothing until asked, unless told to start early."""

    def start_prefetch(self) -> None:
        """Starts computing the first units now (idempotent)."""


@runtime_checkable
class ExecutorKind(Protocol):
    """What ``DataLoader(executor=...)`` takes: a kind of executor of its own (a
    ``RayExecutor``), which makes a stream of the plan's units from ``position``."""

    def make_executor(self, plan: Plan, plan_bytes: bytes, position: int, init_fn: Any = None) -> Executor: ...


@runtime_checkable
class Described(Protocol):
    """An executor kind that describes itself for ``stats()["pipeline"]["executor"]``
    (plain JSON values, with a ``"kind"``); one that does not is named by its class."""

    def describe(self) -> dict[str, Any]: ...


@dataclasses.dataclass(frozen=True)
class ExecutorMaker:
    """Makes the executors of a loader's units, of the kind the loader chose once.

    Calling it with a local position makes an executor of ``plan`` from there:
    ``make(plan, plan_bytes, position, **options)`` for a kind whose units are computed
    elsewhere (worker processes, remote actors: the plan travels pickled, as
    ``plan_bytes``), ``make(plan, position, **options)`` in this process
    (``plan_bytes`` None).

    Attributes:
        make: the executor class or factory (``PoolExecutor``, ``InProcessExecutor``,
            a ``RayExecutor``'s ``make_executor``).
        plan: the plan whose units it computes.
        plan_bytes: ``plan`` pickled for the workers, or None in this process.
        options: the keyword arguments of ``make``.
        wrap: applied to each executor made (an elastic restore's dropping of the
            outputs used before the change), or None.
    """

    make: Callable[..., Any]
    plan: Plan
    plan_bytes: bytes | None = None
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    wrap: Callable[[Any], Any] | None = None

    def __call__(self, position: int) -> Executor:
        if self.plan_bytes is None:
            executor = self.make(self.plan, position, **self.options)
        else:
            executor = self.make(self.plan, self.plan_bytes, position, **self.options)
        return executor if self.wrap is None else self.wrap(executor)

    def for_plan(self, plan: Plan, wrap: Callable[[Any], Any] | None = None) -> ExecutorMaker:
        """The same kind of executor for ``plan`` (another sampler or unit size: an
        elastic restore's, a fingerprint check's), pickled again for the workers."""
        plan_bytes = None
        if self.plan_bytes is not None:
            from dataloader.engine.pool.messages import pickle_plan

            plan_bytes = pickle_plan(plan)
        return dataclasses.replace(self, plan=plan, plan_bytes=plan_bytes, wrap=wrap)
