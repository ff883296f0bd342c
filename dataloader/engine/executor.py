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

from dataloader.engine.compute import UnitResult, compute_unit, hint_unit
from dataloader.engine.plan import Plan
from dataloader.errors import LoaderClosedError
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
        """Stops all background work and frees its resources; idempotent.

        Callable from any thread, and returns in bounded time (seconds) even while a
        ``next()`` waits in another thread; that ``next()`` then raises
        :class:`~dataloader.errors.LoaderClosedError` (or returns a result it had).
        """


# How often a next() waiting on a read-ahead thread looks whether close() was called,
# and how long close() waits for the threads' units in progress.
_POLL_S = 0.25
_CLOSE_WAIT_S = 1.0


class InProcessExecutor:
    """Unit results in order, computed in the caller's thread or by read-ahead threads.

    With ``read_options.num_threads == 0`` a unit is computed when it is asked for, so
    creating the executor costs nothing and a restore is O(1). With threads, up to
    ``prefetch_buffer_size`` units are in flight and results are still handed out in
    unit order. Each finished unit is reported to the plan's unit ranges
    (:meth:`~dataloader.engine.sizing.Units.observe`), which size the next ones.

    ``close()`` from another thread returns within about a second: a ``next()`` waiting
    on a read-ahead thread then raises :class:`~dataloader.errors.LoaderClosedError`.
    User code running in a thread cannot be stopped from outside: a ``next()`` that
    computes in the caller's thread finishes its unit, and a stuck read-ahead thread
    stays stuck (use worker processes and ``unit_timeout_s`` for code that may hang).
    """

    def __init__(self, plan: Plan, position: int, read_options: ReadOptions) -> None:
        self._plan = plan
        self._threads = read_options.num_threads
        self._depth = read_options.prefetch_buffer_size
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._inflight: collections.deque[concurrent.futures.Future[UnitResult]] = collections.deque()
        self._closed = False
        self.reset(position)

    def reset(self, position: int) -> None:
        """Starts again at ``position`` (work in flight is dropped)."""
        for f in self._inflight:
            f.cancel()
        self._inflight.clear()
        self._units = self._plan.units(position)
        self._closed = False

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
            # The next unit is about as long: a source that fetches (a remote one) reads
            # its records while this one is computed.
            hint_unit(self._plan, stop, 2 * stop - start)
            result = compute_unit(self._plan, start, stop)
            self._units.observe(result)
            return result
        self._fill()
        if not self._inflight:
            raise StopIteration
        future = self._inflight[0]
        while True:
            try:
                result = future.result(_POLL_S)
                break
            except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError) as exc:
                if self._closed:
                    raise LoaderClosedError(
                        "the loader was closed while next() waited for a read-ahead "
                        "thread; this iterator is finished: make a new one (or set_state)"
                    ) from None
                if isinstance(exc, concurrent.futures.CancelledError):
                    raise
        self._inflight.popleft()
        # Heard when handed over, in this thread (the sizer is not shared with the
        # threads): the units already in flight were sized without it.
        self._units.observe(result)
        return result

    def close(self) -> None:
        """Cancels queued units and stops the threads; waits at most about a second."""
        self._closed = True
        running = list(self._inflight)
        for f in running:
            f.cancel()
        self._inflight.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
            concurrent.futures.wait(running, _CLOSE_WAIT_S)
