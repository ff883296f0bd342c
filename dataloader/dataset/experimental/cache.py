"""``CacheIterDataset``: a stream computed once, then read from memory, as in Grain.

The iterator keeps every element it reads from its parent, by position, together with
the parent's state after it. A later pass over the same iterator (``set_state`` back to
an earlier state, which is what ``RepeatIterDataset`` does at each epoch) hands out the
kept elements without reading the parent, so the parent's work is done once.

The state stays small: the position and the parent's state at that position (kept in
memory beside the element, so it is known even on a pass served from memory), never the
data. Restoring into a new iterator does not replay the stream: the parent is set to
that state and the cache fills from there; the positions before it are computed when a
later pass first needs them (once), from the parent's first state. Grain instead
replays the stream from the start to refill the cache on such a restore.

Memory: all elements of one pass, and one parent state per element.
"""

from __future__ import annotations

from typing import Any, TypeVar

from dataloader.dataset.base import DatasetIterator, IterDataset
from dataloader.dataset.experimental.checks import as_iter_dataset
from dataloader.engine.stages.base import expect_state

T = TypeVar("T")


class CacheIterDataset(IterDataset[T]):
    """Caches the parent's elements in memory on the first pass (see the module docstring).

    Args:
        parent: the stream to cache (finite, and small enough to hold in memory).

    Example:
        >>> import dataloader as dl
        >>> ds = dl.MapDataset.range(3).to_iter_dataset().map(lambda x: x * x)
        >>> list(dl.experimental.RepeatIterDataset(dl.experimental.CacheIterDataset(ds), 2))
        [0, 1, 4, 0, 1, 4]
    """

    def __init__(self, parent: IterDataset[T]) -> None:
        super().__init__(as_iter_dataset(parent, "CacheIterDataset"))

    def __iter__(self) -> CacheDatasetIterator[T]:
        return CacheDatasetIterator(iter(self._parent))

    def __repr__(self) -> str:
        return f"CacheIterDataset({self._parent!r})"


class CacheDatasetIterator(DatasetIterator[T]):
    """Serves positions from memory where it can, from the parent where it must."""

    def __init__(self, parent: DatasetIterator[T]) -> None:
        super().__init__(parent)
        self._elements: dict[int, T] = {}
        self._states: dict[int, Any] = {0: parent.get_state()}  # parent's state before position p
        self._end: int | None = None  # the number of elements, once the parent ended
        self._position = 0
        self._parent_at: int | None = 0  # the position the parent iterator is at (None: unknown)

    def __next__(self) -> T:
        p = self._position
        if p in self._elements:
            self._position += 1
            return self._elements[p]
        if self._end is not None and p >= self._end:
            raise StopIteration
        if self._parent_at != p:  # lazily: a pass served from memory never moves the parent
            self._parent.set_state(self._states[p])
            self._parent_at = p
        try:
            value = next(self._parent)
        except StopIteration:
            self._end = p
            self._states[p] = self._parent.get_state()
            raise
        self._elements[p] = value
        self._states[p + 1] = self._parent.get_state()
        self._position = self._parent_at = p + 1
        return value

    def get_state(self) -> dict[str, Any]:
        return {"parent": self._states[self._position], "position": self._position}

    def set_state(self, state: dict[str, Any]) -> None:
        state = expect_state(state, ("parent", "position"), "CacheIterDataset")
        p = int(state["position"])
        known = self._states.get(p)
        if known is not None and known != state["parent"]:
            # A state of another stream (or of the parent before a restore): start over.
            self._elements.clear()
            self._states = {0: self._states[0]}
            self._end, self._parent_at = None, None
        self._states[p] = state["parent"]
        self._position = p
