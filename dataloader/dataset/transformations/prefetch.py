"""Prefetching: a thread that computes a stream ahead, and worker processes for a pipeline.

:class:`ThreadPrefetchIterDataset` (Grain's ``grain.experimental`` name) keeps up to
``prefetch_buffer_size`` elements of its parent ready, computed by a background thread,
each with the parent's state right after it; so its own state is that of the last
element handed out, whatever is buffered, and ``set_state`` drops the buffer. Outputs
the parent already holds computed (the rest of a unit a worker pool returned) go over
together with the element before them, even past the buffer: they were in memory
anyway, and one handover a unit costs the trainer far less CPU than one an element.

:class:`MultiprocessPrefetchIterDataset` is ``mp_prefetch`` on a pipeline that has
iterator-level stages: the engine-backed datasets it reads from get the worker
processes (they compute positions, in any process, with identical output), and so do
the element-wise calls after an iterator-level stage (units of its elements shipped to
the workers, :mod:`dataloader.dataset.transformations.pooled`); the iterator-level
stages run ahead in a thread of this process.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from dataloader.dataset.base import DatasetIterator, IterDataset
from dataloader.dataset.context import default_worker_count, workers
from dataloader.dataset.transformations.apply import get_next_index, set_next_index
from dataloader.engine.restore.protocol import ElasticDefaults, StatePart
from dataloader.engine.stages.base import SupportsClose
from dataloader.options import MultiprocessingOptions, check_bool, check_int, most_workers

_POLL_S = 0.05


class _Room:
    """How many more elements the thread may hold that the consumer has not taken.

    ``reserve`` waits for room before the thread asks its source for an element it may
    have to compute; ``charge`` counts those the source already held computed (it may go
    below zero: those were in memory anyway, and the thread waits for the consumer to
    take them before it asks for more); ``give`` returns room as the consumer takes
    elements.
    """

    def __init__(self, size: int) -> None:
        self._free = size
        self._lock = threading.Lock()
        self._freed = threading.Condition(self._lock)

    def reserve(self, stopping: threading.Event) -> bool:
        """Takes room for one element, waiting for it; False once ``stopping`` is set."""
        with self._lock:
            while self._free <= 0:
                if stopping.is_set():
                    return False
                self._freed.wait(_POLL_S)
            self._free -= 1
            return True

    def charge(self, count: int) -> None:
        with self._lock:
            self._free -= count

    def give(self, count: int) -> None:
        with self._lock:
            self._free += count
            self._freed.notify()


class _Producer:
    """The thread and its queue; holds no reference to the iterator that owns it.

    The thread computes at most ``size`` elements ahead of the consumer (:class:`_Room`),
    and hands them over in groups: an element goes with the ones its source already
    holds computed after it (:meth:`DatasetIterator.ready`: a stage whose outputs come
    in units from a worker pool), else alone. Each handover wakes the other thread,
    which costs tens of microseconds of CPU on a busy machine; one a unit instead of one
    an element is what lets the trainer keep up with its workers (measured in
    ``benchmarks/streaming.py --pipeline map``).
    """

    def __init__(self, source: Any, size: int) -> None:
        self.items: queue.SimpleQueue[list[tuple[str, Any, Any]]] = queue.SimpleQueue()
        self.room = _Room(size)
        self.stopping = threading.Event()
        self._source = source
        self._grouped = isinstance(source, DatasetIterator)
        self._group: list[Any] = []  # the consumer's: the group taken, being handed out
        self._at = 0
        self.thread = threading.Thread(target=self._run, name="granary-prefetch", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        # ``held``: the next calls that return what the source holds computed (its
        # ready(), asked once and counted down); ``charged``: those taken for this group,
        # counted once before it is handed over (the consumer cannot give room back for
        # a group before it has it, so this is the room's count element by element too).
        source, held, charged = self._source, 0, 0
        group: list[tuple[str, Any, Any]] = []
        try:
            while True:
                if held:  # computed already: counted, never waited for
                    held -= 1
                    charged += 1
                elif not self.room.reserve(self.stopping):
                    return
                try:
                    element = next(source)
                except StopIteration:
                    group.append(("end", None, source.get_state()))
                    return
                group.append(("ok", element, source.get_state()))
                if not held and self._grouped:
                    held = source.ready()
                if not held:
                    self._hand_over(group, charged)
                    group, charged = [], 0
        except BaseException as exc:  # handed to the consumer at its place, with its type
            group.append(("error", exc, None))
        finally:
            if group:
                self._hand_over(group, charged)

    def _hand_over(self, group: list[tuple[str, Any, Any]], charged: int) -> None:
        if charged:
            self.room.charge(charged)
        self.items.put(group)

    def get(self) -> tuple[str, Any, Any]:
        if self._at == len(self._group):
            self._group, self._at = self._take(), 0
        item = self._group[self._at]
        self._group[self._at] = None  # handed out: not kept alive here
        self._at += 1
        return item

    def _take(self) -> list[tuple[str, Any, Any]]:
        while True:
            try:
                group = self.items.get(timeout=1.0)
            except queue.Empty:
                if not self.thread.is_alive() and self.items.empty():
                    return [("error", RuntimeError("the prefetch thread ended unexpectedly"), None)]
                continue
            self.room.give(len(group))
            return group

    def stop(self) -> None:
        self.stopping.set()
        with contextlib.suppress(queue.Empty):
            while True:
                self.items.get_nowait()
        self._group, self._at = [], 0
        if self.thread is not threading.current_thread():
            self.thread.join()


def _release(producer: _Producer, parent: Any) -> None:
    producer.stopping.set()
    if isinstance(parent, SupportsClose):
        parent.close()
    producer.stop()


class _PrefetchingIterator(DatasetIterator, ElasticDefaults):
    """The thread-owning part of :class:`ThreadPrefetchDatasetIterator`: the producer
    thread pulls elements from the parent, each with the parent's state right after it,
    into a bounded queue; the consumer takes them in order. ``set_state`` stops the
    thread, drops the buffer and restores the parent. An error in the parent reaches
    the consumer at its place, with its type."""

    # stats(): its time in next() is its caller waiting for the thread, not a stage.
    stats_name = None

    def __init__(self, parent: DatasetIterator, buffer_size: int) -> None:
        super().__init__(parent)
        self._size = buffer_size
        self._producer: _Producer | None = None
        self._state = parent.get_state()
        self._finished = False

    def start_prefetch(self) -> None:
        if self._producer is None and not self._finished and not self._closed:
            self._producer = _Producer(self._parent, self._size)
            # The thread holds the parent, not this iterator: dropping the iterator (no
            # close()) stops the thread and closes the parent, so no worker outlives it.
            self._finalizer = weakref.finalize(self, _release, self._producer, self._parent)

    def __next__(self) -> Any:
        if self._closed:
            raise ValueError(f"next() on a closed iterator ({self!r}); make a new one")
        if self._finished:
            raise StopIteration
        if self._producer is None:  # asked once, not on every element
            self.start_prefetch()
            assert self._producer is not None
        kind, value, state = self._producer.get()
        if kind == "ok":
            self._state = state
            return value
        self._finished = True
        if kind == "end":
            self._state = state
            raise StopIteration
        raise value

    def get_state(self) -> dict[str, Any]:
        return self._state

    def set_state(self, state: dict[str, Any]) -> None:
        self._stop()
        self._parent.set_state(state)
        self._state = self._parent.get_state()
        self._finished = False

    # The elastic-restore protocol (dataloader.engine.restore.protocol.ElasticStage): its
    # state is its parent's, and what it computed ahead is dropped on a restore.

    def split_state(self, state: Any) -> StatePart:
        return StatePart(state)

    def restart_elastic(self, resume: Callable[[], None], kept: Sequence[Any]) -> None:
        self._stop()
        resume()
        self._state = self._parent.get_state()
        self._finished = False

    def _stop(self) -> None:
        if self._producer is not None:
            self._finalizer.detach()
            self._producer.stop()
            self._producer = None

    def close(self) -> None:
        self._stop()
        super().close()

    def __repr__(self) -> str:
        return f"ThreadPrefetchDatasetIterator(buffer={self._size})"


def _buffer_size(value: Any) -> int:
    """A thread prefetch's ``prefetch_buffer_size``, checked (Grain's words)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(
            f"`prefetch_buffer_size` must be greater than or equal to 0, got {value!r}; pass "
            f"the number of elements to keep ready (0: no thread)"
        )
    return value


class ThreadPrefetchDatasetIterator(_PrefetchingIterator):
    """Grain's ``ThreadPrefetchDatasetIterator``: ``parent`` computed ahead in a thread.

    The iterator of :class:`ThreadPrefetchIterDataset`, constructible on its own with
    Grain's signature. ``parent`` is any iterator with ``get_state``/``set_state`` (a
    ``DatasetIterator`` or not); ``prefetch_buffer_size=0`` computes each element when it
    is asked for, in the caller's thread. Its state is that of the last element handed
    out; ``get_next_index``/``set_next_index`` reach the parent (for a parent that
    supports them), stopping the thread so that nothing buffered is lost or skipped.

    Raises:
        ValueError: ``prefetch_buffer_size`` is not a non-negative integer.
    """

    def __init__(self, parent: Any, prefetch_buffer_size: int) -> None:
        super().__init__(parent, _buffer_size(prefetch_buffer_size))
        self._next_index: int | None = None  # None: ask the parent

    def start_prefetch(self) -> None:
        if self._size:
            super().start_prefetch()

    def __next__(self) -> Any:
        if not self._size and not self._closed and not self._finished:
            try:
                value = next(self._parent)  # no buffer: computed here, when asked for
            finally:
                self._state = self._parent.get_state()
        else:
            value = super().__next__()
        if self._next_index is not None:
            self._next_index += 1
        return value

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        self._next_index = None

    def _get_next_index(self) -> int:
        if self._next_index is None:
            # The thread has read ahead: put the parent back where this iterator stands.
            if self._producer is not None:
                self._stop()
                self._parent.set_state(self._state)
            self._next_index = get_next_index(self._parent)
        return self._next_index

    def _set_next_index(self, index: int) -> None:
        self._stop()
        set_next_index(self._parent, index)
        self._state = self._parent.get_state()
        self._finished = False
        self._next_index = index


class ThreadPrefetchIterDataset(IterDataset):
    """Computes the parent's elements ahead in a background thread.

    Args:
        parent: the dataset to prefetch.
        prefetch_buffer_size: elements kept ready (0: no thread, elements are computed
            when asked for).

    Example:
        >>> import dataloader as dl
        >>> ds = dl.MapDataset.range(5).to_iter_dataset()
        >>> list(dl.experimental.ThreadPrefetchIterDataset(ds, prefetch_buffer_size=2))
        [0, 1, 2, 3, 4]
    """

    def __init__(self, parent: IterDataset, *, prefetch_buffer_size: int) -> None:
        super().__init__(parent)
        self.prefetch_buffer_size = _buffer_size(prefetch_buffer_size)

    def __iter__(self) -> DatasetIterator:
        inner = iter(self._parent)
        if not self.prefetch_buffer_size:
            return inner
        return ThreadPrefetchDatasetIterator(inner, self.prefetch_buffer_size)

    def __repr__(self) -> str:
        return f"ThreadPrefetchIterDataset({self._parent!r}, prefetch_buffer_size={self.prefetch_buffer_size})"


class MultiprocessPrefetchIterDataset(IterDataset):
    """``mp_prefetch`` of a pipeline with iterator-level stages (see the module docstring)."""

    def __init__(
        self,
        parent: IterDataset,
        options: MultiprocessingOptions | None = None,
        worker_init_fn: Callable[[int, int], Any] | None = None,
    ) -> None:
        super().__init__(parent)
        if options is None:
            options = MultiprocessingOptions(num_workers=default_worker_count())
        if not isinstance(options, MultiprocessingOptions):
            raise TypeError(f"mp_prefetch needs MultiprocessingOptions, got {options!r}")
        if worker_init_fn is not None and not callable(worker_init_fn):
            raise TypeError(f"worker_init_fn must be callable, got {worker_init_fn!r}")
        self.options = options
        self.worker_init_fn = worker_init_fn

    def __iter__(self) -> DatasetIterator:
        with workers(self.options, self.worker_init_fn):
            inner = iter(self._parent)
        size = max(2, most_workers(self.options.num_workers) * self.options.per_worker_buffer_size)
        return ThreadPrefetchDatasetIterator(inner, size)

    def __repr__(self) -> str:
        return f"{self._parent!r}.mp_prefetch({self.options})"


def multithread_prefetch(
    ds: IterDataset, num_threads: int = 1, buffer_size: int = 2, sequential_slice: bool = False
) -> IterDataset:
    """Grain's ``multithread_prefetch``: ``ds`` computed ahead by background threads.

    The output and the states are those of ``ds`` whatever ``num_threads`` is (0: ``ds``
    itself, no thread). Grain cuts ``ds`` into ``num_threads`` slices, which changes the
    output of a filter or a packer with the thread count (and with ``sequential_slice``,
    accepted for Grain's signature: nothing here depends on how work is split); here an
    iterator-level stage is computed whole, ahead, by one thread. Work that parallelises (reading, decoding)
    belongs before ``to_iter_dataset()`` and runs in worker processes (``mp_prefetch``).
    """
    check_bool("sequential_slice", sequential_slice)
    if not check_int("num_threads", num_threads, 0):
        return ds
    return ThreadPrefetchIterDataset(ds, prefetch_buffer_size=check_int("buffer_size", buffer_size, 1))
