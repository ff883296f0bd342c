"""Executors: what computes a stream's units and hands their results over in unit order.

:class:`Executor` is the interface the iterator reads; :class:`InProcessExecutor`
computes units in the training process (``worker_count=0``, optionally with read-ahead
threads) and :class:`~dataloader.engine.pool.executor.PoolExecutor` in worker
processes. Both compute a unit with the same function
(:func:`~dataloader.engine.compute.compute_unit`), so the output never depends on which
one runs it.
"""

from __future__ import annotations

import collections
import concurrent.futures
from collections.abc import Iterator
from typing import Protocol

from dataloader.engine.compute import UnitResult, compute_unit
from dataloader.engine.plan import Plan
from dataloader.options import ReadOptions


class Executor(Protocol):
    """Unit results of one stream, in unit order.

    ``next()`` returns the next unit's :class:`UnitResult` (or raises the error of the
    unit, at its place in the stream); ``StopIteration`` ends the stream.
    """

    def __iter__(self) -> Iterator[UnitResult]: ...

    def __next__(self) -> UnitResult: ...

    def reset(self, position: int) -> None:
        """Starts the stream again at local ``position``; work in flight is dropped."""

    def close(self) -> None:
        """Stops all background work and frees its resources; idempotent."""


class InProcessExecutor:
    """Unit results in order, computed in the caller's thread or by read-ahead threads.

    With ``read_options.num_threads == 0`` a unit is computed when it is asked for, so
    creating the executor costs nothing and a restore is O(1). With threads, up to
    ``prefetch_buffer_size`` units are in flight and results are still handed out in
    unit order.
    """

    def __init__(self, plan: Plan, position: int, read_options: ReadOptions) -> None:
        self._plan = plan
        self._threads = read_options.num_threads
        self._depth = read_options.prefetch_buffer_size
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._inflight: collections.deque[concurrent.futures.Future[UnitResult]] = collections.deque()
        self.reset(position)

    def reset(self, position: int) -> None:
        """Starts again at ``position`` (work in flight is dropped)."""
        for f in self._inflight:
            f.cancel()
        self._inflight.clear()
        self._units = self._plan.units(position)

    def __iter__(self) -> Iterator[UnitResult]:
        return self

    def start_prefetch(self) -> None:
        """Computes units ahead from now on (one thread at least), before the first ``next()``."""
        self._threads, self._depth = max(self._threads, 1), max(self._depth, 1)
        self._fill()

    def _fill(self) -> None:
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                self._threads, thread_name_prefix="granary-read"
            )
        while len(self._inflight) < self._depth:
            unit = next(self._units, None)
            if unit is None:
                break
            self._inflight.append(self._pool.submit(compute_unit, self._plan, *unit))

    def __next__(self) -> UnitResult:
        if not self._threads or not self._depth:
            start, stop = next(self._units)
            return compute_unit(self._plan, start, stop)
        self._fill()
        if not self._inflight:
            raise StopIteration
        return self._inflight.popleft().result()

    def close(self) -> None:
        for f in self._inflight:
            f.cancel()
        self._inflight.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
