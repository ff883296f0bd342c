"""The in-process executor: units computed in the training process, records read ahead.

:class:`InProcessExecutor` is the :class:`~dataloader.engine.executor.Executor` of
``worker_count=0``; :class:`ReadAhead` is its optional read-ahead (Grain's
``ReadOptions``): threads that only read the records of the positions to come, while
the operations run in the caller's thread.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import time
from collections.abc import Iterator
from typing import Any

from dataloader.engine.compute import Read, UnitResult, compute_unit, hint_unit, unit_record_keys
from dataloader.engine.plan import Plan
from dataloader.engine.sizing import result_bytes
from dataloader.errors import LoaderClosedError
from dataloader.options import ReadOptions
from dataloader.sources import read_records

# How often a next() waiting on a read-ahead thread looks whether close() was called,
# and how long close() waits for the threads' reads in progress.
_POLL_S = 0.25
_CLOSE_WAIT_S = 1.0
_CLOSED = ("the loader was closed while next() waited for a read-ahead thread; this "
           "iterator is finished: make a new one (or set_state)")


class InProcessExecutor:
    """Unit results in order, computed in the caller's thread, records read ahead by threads.

    With ``read_options.num_threads == 0`` (or ``prefetch_buffer_size == 0``) a unit reads
    its records when it is computed, so creating the executor costs nothing and a restore
    is O(1); a source that takes hints (:class:`~dataloader.sources.HintedDataSource`)
    hears the next unit's records first. With threads, :class:`ReadAhead` reads the
    records of the positions to come, as Grain's ``ReadOptions`` does: at most
    ``prefetch_buffer_size`` records (and about ``prefetch_buffer_bytes``) ahead, and the
    operations always run in the caller's thread, on records already read. Threads only
    read: a source's read waits on storage and decodes in C with the GIL released, where
    threads help; the operations (parsing, tokenizing) hold the GIL, where 16 threads
    contending for it were slower than one (issue 32: 300-460 rows/s for MaxText's first
    50 batches against 1,560-2,090 after). Each finished unit is reported to the plan's
    unit ranges (:meth:`~dataloader.engine.sizing.Units.observe`), which size the next ones.

    ``close()`` from another thread returns within about a second: a ``next()`` waiting
    on a read-ahead thread then raises :class:`~dataloader.errors.LoaderClosedError`.
    User code running in a thread cannot be stopped from outside: a ``next()`` that
    computes in the caller's thread finishes its unit, and a stuck read stays stuck (use
    worker processes and ``unit_timeout_s`` for code that may hang).
    """

    def __init__(self, plan: Plan, position: int, read_options: ReadOptions) -> None:
        self._plan = plan
        self._options = read_options
        self._ahead: ReadAhead | None = None
        if read_options.num_threads and read_options.prefetch_buffer_size:
            self._ahead = ReadAhead(plan, read_options)
        self.reset(position)

    def reset(self, position: int) -> None:
        """Starts again at ``position`` (reads in flight are dropped)."""
        self._units = self._plan.units(position)
        self._at = position  # the next unit's first position
        if self._ahead is not None:
            self._ahead.reset(position)

    def __iter__(self) -> Iterator[UnitResult]:
        return self

    def describe(self) -> dict[str, Any]:
        return {"worker_kind": "in_process", "read_threads": self._options.num_threads}

    def start_prefetch(self) -> None:
        """Starts reading records ahead now (one thread at least), before the first ``next()``."""
        if self._ahead is None:
            options = self._options
            self._ahead = ReadAhead(self._plan, dataclasses.replace(
                options, num_threads=max(options.num_threads, 1),
                prefetch_buffer_size=options.prefetch_buffer_size or ReadOptions().prefetch_buffer_size))
            self._ahead.reset(self._at)
        self._ahead.fill()

    def __next__(self) -> UnitResult:
        start, stop = next(self._units)
        if self._ahead is None:
            # The next unit is about as long: a source that fetches (a remote one) reads
            # its records while this one is computed.
            hint_unit(self._plan, stop, 2 * stop - start)
            result = compute_unit(self._plan, start, stop)
        else:
            result = compute_unit(self._plan, start, stop, read=self._ahead.take(start, stop))
        self._at = stop
        self._units.observe(result)
        return result

    def close(self) -> None:
        """Stops the read-ahead threads; waits at most about a second."""
        if self._ahead is not None:
            self._ahead.close()


class _Chunk:
    """A run of consecutive positions read by one call, and how much of it was taken."""

    __slots__ = ("future", "nbytes", "start", "stop", "taken")

    def __init__(self, start: int, stop: int, future: concurrent.futures.Future[list[Any]]) -> None:
        self.start, self.stop, self.future = start, stop, future
        self.taken = start  # the first position not yet handed to a unit
        self.nbytes: float | None = None  # the records' size, once read and measured


class ReadAhead:
    """Reads the records of the positions to come on ``num_threads`` threads.

    Grain's ``ReadOptions`` in Grain's units: at most ``prefetch_buffer_size`` records
    are read or being read and not yet taken by the consumer, and about
    ``prefetch_buffer_bytes`` of them: the records read are measured, those being read
    are counted at the mean size seen so far, and the very first read is one record, to
    learn it (at least one record is always asked for, so a record larger than the
    bound still comes). Records are read in chunks of consecutive positions, a thread a
    chunk, whatever the units, so the unit sizes stay the consumer's to choose.

    Only the consumer's thread calls it; the threads only read, never run an operation.
    A chunk whose read failed gives its unit nothing (``take`` returns None): the unit
    then reads its records itself and names the failing one, as without read-ahead.
    """

    def __init__(self, plan: Plan, options: ReadOptions) -> None:
        self._plan = plan
        self._limit = options.prefetch_buffer_size
        self._max_bytes = options.prefetch_buffer_bytes
        # Records per read: two chunks in flight per thread keep every thread busy.
        self._chunk = max(1, -(-self._limit // (2 * options.num_threads)))
        self._threads = options.num_threads
        self._pool = self._new_pool()
        self._chunks: collections.deque[_Chunk] = collections.deque()
        self._next = 0  # the first position not yet asked for
        self._end = plan.num_positions
        self._seen_records = 0  # records read and measured, for the mean size
        self._seen_bytes = 0.0
        self._closed = False

    def _new_pool(self) -> concurrent.futures.ThreadPoolExecutor:
        return concurrent.futures.ThreadPoolExecutor(self._threads, thread_name_prefix="granary-read")

    def reset(self, position: int) -> None:
        """Reads from ``position`` on; what was read for other positions is dropped. After
        ``close()`` it starts new threads (a stream started again)."""
        for chunk in self._chunks:
            chunk.future.cancel()
        self._chunks.clear()
        self._next = position
        if self._closed:
            self._pool, self._closed = self._new_pool(), False

    def held(self) -> int:
        """Records read or being read and not yet taken."""
        return sum(c.stop - c.taken for c in self._chunks)

    def held_bytes(self) -> float:
        """Bytes of the records held: measured once read, else at the mean size."""
        mean = self._mean()
        total = 0.0
        for c in self._chunks:
            left = c.stop - c.taken
            total += left * (mean if c.nbytes is None else c.nbytes / (c.stop - c.start))
        return total

    def _mean(self) -> float:
        return self._seen_bytes / self._seen_records if self._seen_records else 0.0

    def _measure(self) -> None:
        """Measures the chunks whose reads ended since the last look."""
        for c in self._chunks:
            if c.nbytes is None and c.future.done() and not c.future.cancelled() and c.future.exception() is None:
                self._note(c, c.future.result())

    def _note(self, chunk: _Chunk, records: list[Any]) -> None:
        """Measures a chunk's records (once), for the mean size of a record."""
        if chunk.nbytes is None:
            chunk.nbytes = result_bytes(records)
            self._seen_records += len(records)
            self._seen_bytes += chunk.nbytes

    def fill(self) -> None:
        """Asks for the next chunks while the count and the byte bound allow."""
        self._measure()
        held = self.held()
        while not self._closed and (self._end is None or self._next < self._end):
            n = min(self._limit - held, self._chunk)
            if self._max_bytes is not None:
                if not self._seen_records:
                    n = 0 if self._chunks else 1  # one record first, to learn their size
                else:
                    n = min(n, int((self._max_bytes - self.held_bytes()) // self._mean()))
                if not held:
                    n = max(n, 1)  # never stall on a record larger than the bound
            if n <= 0:
                return
            stop = self._next + n if self._end is None else min(self._next + n, self._end)
            keys = unit_record_keys(self._plan, self._next, stop)
            future = self._pool.submit(read_records, self._plan.source, keys)
            self._chunks.append(_Chunk(self._next, stop, future))
            held += stop - self._next
            self._next = stop

    def take(self, start: int, stop: int) -> Read | None:
        """The records of positions ``[start, stop)``, after their reads (None: a read
        failed, and the unit reads them itself). Units come in order; a unit elsewhere
        (a restore) starts the reading again there."""
        began = time.perf_counter()
        if not self._chunks or self._chunks[0].taken != start:
            self.reset(start)
        records: list[Any] = []
        failed = False
        at = start
        while at < stop:
            self.fill()
            if self._closed or not self._chunks:
                raise LoaderClosedError(_CLOSED)
            chunk = self._chunks[0]
            got = self._result(chunk)
            upto = min(stop, chunk.stop)
            if got is None:
                failed = True
            else:
                self._note(chunk, got)
                records.extend(got[at - chunk.start : upto - chunk.start])
            chunk.taken = at = upto
            if chunk.taken == chunk.stop:
                self._chunks.popleft()
        self.fill()  # the records taken make room: read on while the unit is computed
        return None if failed else Read(records, time.perf_counter() - began)

    def _result(self, chunk: _Chunk) -> list[Any] | None:
        """The chunk's records once read; None when its read failed or was dropped."""
        while True:
            try:
                return chunk.future.result(_POLL_S)
            except concurrent.futures.TimeoutError:
                if self._closed:
                    raise LoaderClosedError(_CLOSED) from None
            except concurrent.futures.CancelledError:
                if self._closed:
                    raise LoaderClosedError(_CLOSED) from None
                return None
            except Exception:  # the unit's own read reports it, at its record
                return None

    def close(self) -> None:
        """Cancels the reads not started and stops the threads; waits at most about a
        second. Callable from any thread: a ``take`` waiting in another then raises
        :class:`~dataloader.errors.LoaderClosedError` (the chunks stay the consumer's)."""
        self._closed = True
        running = [c.future for c in list(self._chunks)]
        for f in running:
            f.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)
        concurrent.futures.wait(running, _CLOSE_WAIT_S)
