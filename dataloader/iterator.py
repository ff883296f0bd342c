"""Iterators: the ``DatasetIterator`` protocol (as Grain's) and the loader's own iterator.

:class:`DatasetIterator` is what every iterator of the package is (and what a user's
own iterator subclasses): ``next()``, ``get_state()``, ``set_state()``, ``close()`` and
``start_prefetch()``. :class:`DataLoaderIterator` is the engine's: ordered outputs of a
``DataLoader``, checkpointable at every step.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

from dataloader.engine.assemble import make_assembler
from dataloader.engine.executor import Executor
from dataloader.engine.state import Cursor, make_state, resolve_state
from dataloader.engine.stats import Counted, Stats

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


class DataLoaderIterator(DatasetIterator[Any]):
    """Iterates a :class:`~dataloader.DataLoader`; checkpointable at every step.

    ``get_state()`` describes the position after the last output handed out, whatever
    is still being computed or buffered; ``set_state(state)`` continues with the very
    next output in O(1) time, with any worker count.

    Example:
        >>> it = iter(loader)                       # doctest: +SKIP
        >>> first = next(it); state = it.get_state()
        >>> it2 = iter(loader); it2.set_state(state)
        >>> # next(it2) equals next(it)
    """

    def __init__(self, loader: Any, state: Any = None) -> None:
        super().__init__()
        self._loader = loader
        self._plan = loader.plan
        self._executor: Executor | None = None
        self._assembler: Any = None
        self._closed = False
        self._stats = Stats()
        self._restart(resolve_state(self._plan, state) if state is not None else Cursor(0))

    def _restart(self, cursor: Cursor) -> None:
        if self._executor is None:
            self._executor = self._loader._make_executor(cursor.position)
        else:
            self._executor.reset(cursor.position)  # keeps worker processes up
        self._assembler = make_assembler(
            self._plan, Counted(self._executor, self._stats), cursor, self._stats.seconds
        )

    def __iter__(self) -> DataLoaderIterator:
        return self

    def __next__(self) -> Any:
        if self._closed:
            raise StopIteration
        return self._assembler.next()

    def get_state(self) -> dict[str, Any]:
        """A small JSON-able dict: the position after the last output handed out."""
        return make_state(self._plan, self._assembler.state())

    def set_state(self, state: Any) -> None:
        """Continues from ``state`` (a dict from ``get_state``, or its JSON text).

        Raises:
            StateMismatchError: the state was made for another data set, seed, sharding
                or pipeline; the message names each difference.
        """
        self._restart(resolve_state(self._plan, state))
        self._closed = False

    def stats(self) -> dict[str, Any]:
        """Where the time went since this iterator was made (see :class:`Stats`)."""
        return self._stats.as_dict()

    def close(self) -> None:
        """Stops all background work; safe to call more than once."""
        self._closed = True
        if self._executor is not None:
            self._executor.close()
