"""``DatasetIterator``: the protocol of every iterator in the package, as Grain defines it.

An iterator yields elements, says where it is (``get_state()``: a small JSON-able dict)
and goes back there (``set_state()``). Iterators that read other iterators (the
iterator-level stages beside this module, a user's own) pass them to ``__init__`` as
parents, so that ``close()`` and ``start_prefetch()`` reach the whole chain, and nest
their parents' states in their own (``{"parent": ..., ...}``).
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


class DatasetIterator(Iterator[T], abc.ABC):
    """An iterator of an ``IterDataset``: elements, and a state to resume from.

    Subclasses define ``__next__``, ``get_state`` and ``set_state``; pass the parent
    iterators to ``__init__`` so that ``close`` and ``start_prefetch`` reach them.

    Args:
        parents: the iterators this one reads from (one, several, or none for a source).
    """

    def __init__(self, parents: DatasetIterator | Sequence[DatasetIterator] = ()) -> None:
        if isinstance(parents, Iterator) and not isinstance(parents, Sequence):
            parents = (parents,)
        self._parents: tuple[Any, ...] = tuple(parents)
        self._closed = False

    @property
    def _parent(self) -> Any:
        if len(self._parents) != 1:
            raise ValueError(f"{type(self).__name__} has {len(self._parents)} parents, not one")
        return self._parents[0]

    def __iter__(self) -> DatasetIterator[T]:
        return self

    @abc.abstractmethod
    def get_state(self) -> dict[str, Any]:
        """A JSON-able dict describing the position after the last element handed out."""

    @abc.abstractmethod
    def set_state(self, state: dict[str, Any]) -> None:
        """Continues right after the element that ``state`` (from ``get_state``) describes."""

    def start_prefetch(self) -> None:
        """Starts producing elements before the first ``next()`` (where an ancestor can).

        Call it right after making the iterator (and ``set_state``), then restore the
        model: the first batches are made while the checkpoint loads. Idempotent.
        """
        for parent in self._parents:
            if hasattr(parent, "start_prefetch"):
                parent.start_prefetch()

    def stats(self) -> dict[str, Any]:
        """Where the time went (see :class:`~dataloader.engine.stats.Stats`): the stats of
        the engine under this iterator, or zeros for a stream with no engine."""
        for parent in self._parents:
            if hasattr(parent, "stats"):
                return parent.stats()
        from dataloader.engine.stats import Stats

        return Stats().as_dict()

    def _get_next_index(self) -> int:
        """The index of the next element, where it is known without processing."""
        raise ValueError(
            f"{type(self).__name__} cannot tell the index of its next element without "
            f"processing the stream (Grain's get_next_index)"
        )

    def _set_next_index(self, index: int) -> None:
        raise ValueError(
            f"{type(self).__name__} cannot move to element {index} without processing the "
            f"stream before it (Grain's set_next_index); restore a state with set_state"
        )

    def close(self) -> None:
        """Stops background work of this iterator and its ancestors; idempotent."""
        if self._closed:
            return
        self._closed = True
        for parent in self._parents:
            if hasattr(parent, "close"):
                parent.close()

    def __enter__(self) -> DatasetIterator[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
