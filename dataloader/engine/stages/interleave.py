"""Interleaving: ``cycle_length`` streams open at a time, read round-robin.

The iterator of Grain's ``InterleaveIterDataset``, with Grain's order: slot ``k`` of
the cycle holds an open stream; each ``next()`` takes one element from the slot whose
turn it is and moves the turn on. A slot whose stream ends is closed and, on its next
turn, opens the next stream not yet opened (then reads from it at once); when none
is left, the cycle runs on with fewer slots until every slot is empty. With
``cycle_length`` 1 the streams are chained; with as many slots as streams, they are
mixed in equal turns.

The order is a function of the streams' contents only: streams are opened at fixed
points of the sequence and each is read in its own order, so threads that open
streams ahead (``num_make_iter_threads``) or read them ahead (the opener's business)
change when work happens, never what comes out.

The state, with Grain's field names, says where each slot is: which stream it holds
(``iterators_in_use_indices``), that stream's own state (or its final state once it
ended, with ``exhausted`` set; ``None`` for a slot not opened yet), whose turn it is
and how many streams were opened. A restore opens the ``cycle_length`` streams of the
state and restores each (a stream already open for the same slot is restored in
place); nothing is replayed.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable
from concurrent import futures
from typing import Any

from dataloader.engine.stages.base import DatasetIterator, expect_state
from dataloader.engine.stats import collect
from dataloader.engine.stats.protocol import StatsParticipant
from dataloader.engine.stats.shape import add_totals, empty_totals
from dataloader.errors import StateMismatchError

Opener = Callable[[int], DatasetIterator]


class _Maker:
    """Opens the next streams ahead of need in a thread pool, started (read-ahead on)."""

    def __init__(self, opener: Opener, threads: int, ahead: int) -> None:
        self._opener = opener
        self._ahead = ahead
        self._pool = futures.ThreadPoolExecutor(threads, thread_name_prefix="granary-interleave")
        self._pending: dict[int, futures.Future[DatasetIterator]] = {}

    def _open_started(self, index: int) -> DatasetIterator:
        it = self._opener(index)
        it.start_prefetch()
        return it

    def take(self, index: int, count: int) -> DatasetIterator:
        """Stream ``index`` (of ``count``), made now unless it was made ahead; then
        starts making the ``ahead`` streams after it."""
        pending = self._pending.pop(index, None)
        it = pending.result() if pending is not None else self._opener(index)
        for later in range(index + 1, min(index + 1 + self._ahead, count)):
            if later not in self._pending:
                self._pending[later] = self._pool.submit(self._open_started, later)
        return it

    def discard(self) -> None:
        """Drops the streams made ahead (after a restore, and on close)."""
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.cancel():
                with contextlib.suppress(Exception):
                    future.result().close()

    def close(self) -> None:
        self.discard()
        self._pool.shutdown(wait=True)


def _close_all(slots: list[Any], maker: _Maker | None) -> None:
    """Closes what an interleave holds (also run when it is garbage-collected unclosed)."""
    for k, it in enumerate(slots):
        if it is not None:
            slots[k] = None
            it.close()
    if maker is not None:
        maker.close()


class InterleaveDatasetIterator(DatasetIterator):
    """Round-robin over ``cycle_length`` open streams out of ``count`` (see the module).

    Args:
        opener: ``opener(i)`` makes the iterator of stream ``i`` (at its start).
        count: how many streams there are.
        cycle_length: how many are open at a time (at most ``count``).
        num_make_iter_threads: threads that open streams ahead (0: open when needed).
        make_iter_buffer_size: how many streams to keep opened ahead.
    """

    def __init__(
        self,
        opener: Opener,
        count: int,
        cycle_length: int,
        num_make_iter_threads: int = 0,
        make_iter_buffer_size: int = 0,
    ) -> None:
        super().__init__()
        self._opener = opener
        self._count = count
        self._cycle = min(cycle_length, count)
        self._slots: list[DatasetIterator | None] = [None] * self._cycle
        self._indices = list(range(self._cycle))
        self._ended: list[Any] = [None] * self._cycle  # final state of a slot's ended stream
        self._turn = 0
        self._opened = 0
        self._retired = empty_totals()  # stats of the streams that ended
        self._retired_s = 0.0  # and their seconds in next(), called from this one
        self._maker = (
            _Maker(opener, num_make_iter_threads, make_iter_buffer_size)
            if num_make_iter_threads and make_iter_buffer_size
            else None
        )
        # Streams may run threads of their own: close them if this iterator is dropped.
        self._finalizer = weakref.finalize(self, _close_all, self._slots, self._maker)

    def _open(self, index: int) -> DatasetIterator:
        if self._maker is not None:
            return self._maker.take(index, self._count)
        return self._opener(index)

    def _next_turn(self) -> None:
        self._turn = (self._turn + 1) % self._cycle

    def __next__(self) -> Any:
        if self._closed:
            raise ValueError(f"next() on a closed iterator ({self!r}); make a new one")
        if not self._cycle:
            raise StopIteration
        while True:
            slot = self._turn
            it = self._slots[slot]
            if it is not None:
                try:
                    element = next(it)
                except StopIteration:
                    self._ended[slot] = it.get_state()
                    self._slots[slot] = None
                    self._retire(it)
                    it.close()
                    self._next_turn()
                    continue
                self._next_turn()
                return element
            if self._opened < self._count:
                self._slots[slot] = self._open(self._opened)
                self._indices[slot] = self._opened
                self._ended[slot] = None
                self._opened += 1
            elif all(s is None for s in self._slots):
                raise StopIteration
            else:
                self._next_turn()

    def get_state(self) -> dict[str, Any]:
        states = [
            it.get_state() if it is not None else self._ended[k] for k, it in enumerate(self._slots)
        ]
        return {
            "next_index_in_cycle": self._turn,
            "next_index_in_datasets": self._opened,
            "iterators_in_use_indices": list(self._indices),
            "iterators_in_use_states": states,
            # ints rather than bools, as Grain writes them
            "exhausted": [int(it is None and e is not None) for it, e in zip(self._slots, self._ended)],
        }

    def set_state(self, state: dict[str, Any]) -> None:
        indices, states, exhausted = self._check(state)
        for slot, (index, it_state, ended) in enumerate(zip(indices, states, exhausted)):
            current = self._slots[slot]
            keep = current is not None and self._indices[slot] == index and it_state is not None and not ended
            if current is not None and not keep:
                self._slots[slot] = None
                self._retire(current)
                current.close()
            self._ended[slot] = it_state if ended else None
            if it_state is not None and not ended:
                it = current if keep else self._opener(index)
                assert it is not None
                self._slots[slot] = it
                it.set_state(it_state)
        self._indices = list(indices)
        self._turn = int(state["next_index_in_cycle"])
        self._opened = int(state["next_index_in_datasets"])
        if self._maker is not None:
            self._maker.discard()

    def _check(self, state: Any) -> tuple[list[int], list[Any], list[int]]:
        keys = ("next_index_in_cycle", "next_index_in_datasets", "iterators_in_use_indices",
                "iterators_in_use_states", "exhausted")
        expect_state(state, keys, "an interleave")
        indices = [int(i) for i in state["iterators_in_use_indices"]]
        states, exhausted = list(state["iterators_in_use_states"]), [int(e) for e in state["exhausted"]]
        if not len(indices) == len(states) == len(exhausted) == self._cycle:
            raise StateMismatchError(
                f"this state was saved by an interleave of {len(indices)} open datasets but this "
                f"one keeps {self._cycle} open (cycle_length={self._cycle} over {self._count} "
                f"datasets); restore with the cycle_length and datasets the state was made for"
            )
        opened = int(state["next_index_in_datasets"])
        if opened > self._count or any(not 0 <= i < self._count for i, s in zip(indices, states) if s is not None):
            raise StateMismatchError(
                f"this state refers to dataset {max([opened - 1, *indices])} but this interleave "
                f"has {self._count} datasets; restore with the datasets the state was made for"
            )
        return indices, states, exhausted

    def start_prefetch(self) -> None:
        for it in self._slots:
            if it is not None:
                it.start_prefetch()

    def _retire(self, it: Any) -> None:
        """Keeps the stats of a stream that ended (stats() adds them up)."""
        if not isinstance(it, StatsParticipant):
            return
        add_totals(self._retired, it._stats_totals())
        if it._clock is not None and it._clock.thread == collect.clock_of(self).thread:
            self._retired_s += it._clock.inside_s()

    def _stats_parents(self) -> list[Any]:
        return [it for it in self._slots if it is not None]

    def _stats_totals(self) -> dict[str, Any]:
        return collect.chain_totals(self, self._retired, self._retired_s)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._finalizer()

    def __repr__(self) -> str:
        return f"InterleaveDatasetIterator({self._count} datasets, cycle_length={self._cycle})"
