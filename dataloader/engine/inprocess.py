"""Computes units in the training process (``worker_count=0``)."""

from __future__ import annotations

import collections
import concurrent.futures
from collections.abc import Iterator

from dataloader.engine.compute import UnitResult, compute_unit
from dataloader.engine.plan import Plan
from dataloader.options import ReadOptions


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

    def __next__(self) -> UnitResult:
        if not self._threads:
            start, stop = next(self._units)
            return compute_unit(self._plan, start, stop)
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                self._threads, thread_name_prefix="granary-read"
            )
        while len(self._inflight) < self._depth:
            unit = next(self._units, None)
            if unit is None:
                break
            self._inflight.append(self._pool.submit(compute_unit, self._plan, *unit))
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
