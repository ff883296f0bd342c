"""Grain's ``InterleaveIterDataset``: several datasets read ``cycle_length`` at a time.

The way to read sources without random access (Parquet, TFRecord, one stream per
file) with some mixing, as MaxText does::

    files = dl.MapDataset.source(paths).seed(0).shuffle().repeat(epochs)  # file order per epoch
    rows = dl.experimental.InterleaveIterDataset(files.map(dl.experimental.ParquetIterDataset),
                                                 cycle_length=4)

``datasets`` is a sequence of ``IterDataset`` or ``MapDataset`` (a ``MapDataset`` is read
as ``to_iter_dataset()``), or a ``MapDataset`` whose elements are datasets (computed when
their turn to open comes).

Its iterator keeps Grain's order: slot ``k`` of the cycle holds an open stream; each
``next()`` takes one element from the slot whose turn it is and moves the turn on. A slot whose stream ends is closed and, on its next
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

Where it runs: in the consumer's process (or, under ``mp_prefetch``, in its thread), as
every iterator-level stage. Its output never depends on the number of workers: Grain
instead gives each worker process a slice of ``datasets``, which changes the order with
``num_workers``. The datasets being interleaved run as they were built: an
engine-backed one with its own ``mp_prefetch`` has its own workers.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import weakref
from collections.abc import Callable, Sequence
from concurrent import futures
from typing import Any

from dataloader.dataset.base import DatasetIterator, IterDataset
from dataloader.dataset.map_dataset import MapDataset
from dataloader.dataset.transformations.apply import get_next_index, set_next_index
from dataloader.dataset.transformations.prefetch import ThreadPrefetchDatasetIterator
from dataloader.engine.stages.base import expect_state
from dataloader.engine.stats import collect
from dataloader.engine.stats.protocol import StatsParticipant
from dataloader.engine.stats.shape import add_totals, empty_totals
from dataloader.errors import StateMismatchError
from dataloader.options import check_int

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
        # Streams not opened yet whose place a restore of shard states gave: index ->
        # {"exhausted": 0 or 1, "state": its state, or None for its start}.
        self._future: dict[int, dict[str, Any]] = {}
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
                index, self._opened = self._opened, self._opened + 1
                future = self._future.pop(index, None)
                if future is not None and future["exhausted"]:
                    continue  # read to its end before a restore of shard states
                it = self._slots[slot] = self._open(index)
                self._indices[slot] = index
                self._ended[slot] = None
                if future is not None and future["state"] is not None:
                    it.set_state(future["state"])
            elif all(s is None for s in self._slots):
                raise StopIteration
            else:
                self._next_turn()

    def get_state(self) -> dict[str, Any]:
        # One pass over the slots: a stage that ships this stream to workers takes the
        # state before every element (1.7 -> 1.1 us with four Parquet files open).
        states: list[Any] = []
        exhausted: list[int] = []  # ints rather than bools, as Grain writes them
        for it, ended in zip(self._slots, self._ended):
            if it is None:
                states.append(ended)
                exhausted.append(0 if ended is None else 1)
            else:
                states.append(it.get_state())
                exhausted.append(0)
        state = {
            "next_index_in_cycle": self._turn,
            "next_index_in_datasets": self._opened,
            "iterators_in_use_indices": self._indices.copy(),
            "iterators_in_use_states": states,
            "exhausted": exhausted,
        }
        if self._future:  # after a restore of shard states (Grain's key)
            state["future_states"] = {str(i): f for i, f in sorted(self._future.items())}
        return state

    def get_shard_states(self) -> list[dict[str, Any]]:
        """The state of each of its datasets, in order, as Grain's elastic iterator keys
        them: ``{"exhausted": 0 or 1, "state": ...}`` (``state`` None: from its start).

        Raises:
            ValueError: the datasets are endless (a ``MapDataset`` repeated for ever).
        """
        if self._count > MAX_SHARD_STATES:
            raise ValueError(
                f"get_shard_states needs a finite list of datasets, this interleave has {self._count}; "
                f"save with get_state() and restore on the same shard count"
            )
        live = {self._indices[k]: k for k in range(self._cycle) if self._slots[k] is not None or self._ended[k] is not None}
        out = []
        for i in range(self._count):
            if i in live:
                k = live[i]
                it = self._slots[k]
                out.append({"exhausted": 0, "state": it.get_state()} if it is not None
                           else {"exhausted": 1, "state": self._ended[k]})
            elif i < self._opened:
                out.append({"exhausted": 1, "state": None})  # read to its end and closed
            else:
                out.append(self._future.get(i, {"exhausted": 0, "state": None}))
        return out

    def set_shard_states(self, shard_states: list[dict[str, Any]]) -> None:
        """Continues from :meth:`get_shard_states` of datasets that were spread over other
        shards (every state of this interleave's datasets, in order): the first
        ``cycle_length`` not exhausted go on in the slots, the others when their turn to
        open comes; an exhausted one is never opened again."""
        if len(shard_states) != self._count:
            raise StateMismatchError(
                f"set_shard_states got {len(shard_states)} dataset states for an interleave of "
                f"{self._count} datasets; pass one for each dataset this shard reads"
            )
        going = [i for i, s in enumerate(shard_states) if not s["exhausted"]][: self._cycle]
        for slot, it in enumerate(self._slots):
            if it is not None:
                self._slots[slot] = None
                self._retire(it)
                it.close()
        self._ended = [None] * self._cycle
        for slot, index in enumerate(going):
            it = self._slots[slot] = self._opener(index)
            self._indices[slot] = index
            if shard_states[index]["state"] is not None:
                it.set_state(shard_states[index]["state"])
        self._turn = 0
        self._opened = max(going) + 1 if going else 0
        self._future = {i: dict(s) for i, s in enumerate(shard_states) if i >= self._opened}
        if self._maker is not None:
            self._maker.discard()

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
        self._future = {int(i): dict(f) for i, f in state.get("future_states", {}).items()}
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
        add_totals(self._retired, it.stats_totals())
        if it.stats_clock is not None and it.stats_clock.thread == collect.clock_of(self).thread:
            self._retired_s += it.stats_clock.inside_s()

    def stats_parents(self) -> list[Any]:
        return [it for it in self._slots if it is not None]

    def stats_totals(self) -> dict[str, Any]:
        return collect.chain_totals(self, self._retired, self._retired_s)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._finalizer()

    def __repr__(self) -> str:
        return f"InterleaveDatasetIterator({self._count} datasets, cycle_length={self._cycle})"


# Datasets an interleave gives shard states for (an endless list has none to give).
MAX_SHARD_STATES = 1 << 20

# Every open dataset holds files and buffers; a cycle this long is a mistake (typically
# cycle_length=len(ds) over a dataset repeated for ever), not a plan.
MAX_CYCLE_LENGTH = 4096


class InterleaveIterDataset(IterDataset):
    """Interleaves ``datasets``, ``cycle_length`` of them open at a time, round-robin.

    Args:
        datasets: ``IterDataset``/``MapDataset`` objects, or a ``MapDataset`` of them.
        cycle_length: how many datasets are read at a time (1: one after another).
        num_make_iter_threads: threads that open the next datasets ahead (0: none).
        make_iter_buffer_size: how many datasets to keep opened ahead.
        iter_buffer_size: elements each open ``IterDataset`` computes ahead in a thread
            of its own. 0 by default (Grain: 1): handing every element from a thread to
            the consumer took the MaxText Parquet path from ~110k to ~9.5k rows/s here,
            and the file sources and engine-backed streams read ahead by themselves.
            Worth it for a dataset of your own that waits on I/O.

    Raises:
        ValueError: ``cycle_length`` is not a positive integer, or opens more than
            4096 datasets at once; a buffer or thread count is negative.
        TypeError: an element of a sequence ``datasets`` is not a dataset.

    Example:
        >>> import dataloader as dl
        >>> parts = [dl.MapDataset.source(p).to_iter_dataset() for p in ([1, 2, 3], [4], [5, 6])]
        >>> list(dl.experimental.InterleaveIterDataset(parts, cycle_length=2))
        [1, 4, 2, 3, 5, 6]
    """

    def __init__(
        self,
        datasets: Sequence[IterDataset | MapDataset] | MapDataset,
        *,
        cycle_length: int,
        num_make_iter_threads: int = 1,
        make_iter_buffer_size: int = 1,
        iter_buffer_size: int = 0,
    ) -> None:
        # Not passed as parents: a MapDataset of datasets is computed lazily, one by one.
        super().__init__()
        if isinstance(datasets, MapDataset):
            self._datasets: Any = datasets
        elif isinstance(datasets, Sequence) and not isinstance(datasets, (str, bytes)):
            self._datasets = list(datasets)
            for i, ds in enumerate(self._datasets):
                _check_dataset(ds, i)
        else:
            raise TypeError(
                f"InterleaveIterDataset needs a sequence of datasets or a MapDataset of "
                f"datasets, got {datasets!r}"
            )
        if isinstance(cycle_length, bool) or not isinstance(cycle_length, int) or cycle_length < 1:
            raise ValueError(
                f"cycle_length must be a positive integer (how many datasets to read at a "
                f"time), got {cycle_length!r}"
            )
        self.cycle_length = cycle_length
        if min(cycle_length, len(self._datasets)) > MAX_CYCLE_LENGTH:
            endless = len(self._datasets) == sys.maxsize
            raise ValueError(
                f"cycle_length={cycle_length} would keep {min(cycle_length, len(self._datasets))} "
                f"datasets open at once (at most {MAX_CYCLE_LENGTH})"
                + ("; datasets is repeated for ever, so pass a cycle_length rather than "
                   "len(datasets)" if endless else "; pass a smaller cycle_length")
            )
        self.num_make_iter_threads = check_int("num_make_iter_threads", num_make_iter_threads, 0)
        self.make_iter_buffer_size = check_int("make_iter_buffer_size", make_iter_buffer_size, 0)
        self.iter_buffer_size = check_int("iter_buffer_size", iter_buffer_size, 0)

    def __iter__(self) -> DatasetIterator:
        return _InterleaveIterator(
            functools.partial(_open, self._datasets, self.iter_buffer_size),
            len(self._datasets),
            self.cycle_length,
            self.num_make_iter_threads,
            self.make_iter_buffer_size,
        )

    def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
        """Keeps ``datasets[sl]`` (Grain's hook for sharding a dataset in place)."""
        del sequential_slice  # the datasets are sliced either way, as in Grain
        self._datasets = self._datasets[sl]

    def __repr__(self) -> str:
        return f"InterleaveIterDataset([{len(self._datasets)} datasets], cycle_length={self.cycle_length})"


class _InterleaveIterator(InterleaveDatasetIterator):
    """The interleave's iterator, with Grain's next index where Grain has one: over a
    single dataset it is that dataset's (with several, an element's index in the
    interleaved stream says nothing about where each dataset stands)."""

    def _single(self, what: str) -> None:
        if self._count != 1:
            raise NotImplementedError(
                f"{what} is not supported for InterleaveDatasetIterator with more than one "
                f"dataset (this one interleaves {self._count}); save and restore with "
                f"get_state/set_state"
            )

    def _get_next_index(self) -> int:
        self._single("get_next_index")
        it = self._slots[0]
        if it is None:  # not opened yet, or ended
            return 0 if self._ended[0] is None else get_next_index(self._reopened())
        return get_next_index(it)

    def _set_next_index(self, index: int) -> None:
        self._single("set_next_index")
        it = self._slots[0] or self._reopened()
        set_next_index(it, index)

    def _reopened(self) -> DatasetIterator:
        """The iterator of the single dataset in slot 0, opened (where it ended, if it did)."""
        it = self._opener(0)
        if self._ended[0] is not None:
            it.set_state(self._ended[0])
        self._slots[0], self._indices[0], self._ended[0] = it, 0, None
        self._opened = 1
        return it


def _open(datasets: Any, iter_buffer_size: int, index: int) -> DatasetIterator:
    """The iterator of ``datasets[index]``, read ahead in a thread if asked to."""
    ds = datasets[index]
    _check_dataset(ds, index)
    if isinstance(ds, MapDataset):
        return iter(ds.to_iter_dataset())
    it = iter(ds)
    if iter_buffer_size and not isinstance(it, ThreadPrefetchDatasetIterator):
        return ThreadPrefetchDatasetIterator(it, iter_buffer_size)
    return it


def _check_dataset(ds: Any, index: int) -> None:
    if not isinstance(ds, (IterDataset, MapDataset)):
        raise TypeError(
            f"InterleaveIterDataset: dataset {index} is {ds!r}, expected an IterDataset or a "
            f"MapDataset (e.g. map file names to ParquetIterDataset)"
        )
