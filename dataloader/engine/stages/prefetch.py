"""A thread that computes a stream ahead, keeping the state of what it handed out.

The producer thread pulls elements from the parent iterator, each with the parent's
state right after it, into a bounded queue; the consumer takes them in order. So the
iterator's state is that of the last element handed out, whatever is buffered, and
``set_state`` stops the thread, drops the buffer and restores the parent. An error in
the parent reaches the consumer at its place, with its type.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import weakref
from typing import Any

from dataloader.engine.stages.base import DatasetIterator

_POLL_S = 0.05


class _Producer:
    """The thread and its queue; holds no reference to the iterator that owns it."""

    def __init__(self, source: Any, size: int) -> None:
        self.items: queue.Queue[tuple[str, Any, Any]] = queue.Queue(size)
        self.stopping = threading.Event()
        self._source = source
        self.thread = threading.Thread(target=self._run, name="granary-prefetch", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        source = self._source
        try:
            while not self.stopping.is_set():
                try:
                    element = next(source)
                except StopIteration:
                    self._put(("end", None, source.get_state()))
                    return
                if not self._put(("ok", element, source.get_state())):
                    return
        except BaseException as exc:  # handed to the consumer at its place, with its type
            self._put(("error", exc, None))

    def _put(self, item: tuple[str, Any, Any]) -> bool:
        while not self.stopping.is_set():
            try:
                self.items.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def get(self) -> tuple[str, Any, Any]:
        while True:
            try:
                return self.items.get(timeout=1.0)
            except queue.Empty:
                if not self.thread.is_alive() and self.items.empty():
                    return ("error", RuntimeError("the prefetch thread ended unexpectedly"), None)

    def stop(self) -> None:
        self.stopping.set()
        with contextlib.suppress(queue.Empty):
            while True:
                self.items.get_nowait()
        if self.thread is not threading.current_thread():
            self.thread.join()


def _release(producer: _Producer, parent: Any) -> None:
    producer.stopping.set()
    close = getattr(parent, "close", None)
    if close is not None:
        close()
    producer.stop()


class ThreadPrefetchDatasetIterator(DatasetIterator):
    """The iterator of :class:`ThreadPrefetchIterDataset` (see there)."""

    # stats(): its time in next() is its caller waiting for the thread, not a stage.
    _stats_name = None

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
