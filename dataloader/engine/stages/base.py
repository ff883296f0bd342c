"""``DatasetIterator``: the protocol of every iterator in the package, as Grain defines it.

An iterator yields elements, says where it is (``get_state()``: a small JSON-able dict)
and goes back there (``set_state()``). Iterators that read other iterators (the
iterator-level stages beside this module, a user's own) pass them to ``__init__`` as
parents, so that ``close()`` and ``start_prefetch()`` reach the whole chain, and nest
their parents' states in their own (``{"parent": ..., ...}``).

Every subclass's ``__next__`` runs under the iterator's stats clock (wrapped once, when
the class is made; see :mod:`dataloader.engine.stats.clock`), so each stage, a user's
own included, reports its time and its outputs in ``stats()`` without doing anything.
A subclass's ``__next__`` that calls its base class's is counted once.

Every subclass's ``set_state`` is wrapped the same way for one case: given a list (or
tuple) of states, every old host's of an elastic restore, it hands them to the restore
room (:func:`~dataloader.engine.restore.every_host.restore_every_host`), which restores
the whole chain under the iterator through the elastic-restore protocol, or refuses,
naming the stage that cannot take part. ``set_state`` itself only ever sees its own state.
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

from dataloader.engine.restore.grain import is_grain_state
from dataloader.engine.stats import collect
from dataloader.engine.stats.clock import Clock, Hook
from dataloader.errors import StateMismatchError

T = TypeVar("T")

# The members of the stats protocol (and closes_from_any_thread) had private names; a
# class still defining one would silently drop out of stats(), so it is refused instead.
_PUBLIC_NOW = {"_clock": "stats_clock"} | {f"_{name}": name for name in (
    "stats_name", "stats_batches", "stats_exact", "stats_totals", "stats_parents", "stats_pipeline",
    "closes_from_any_thread")}


@runtime_checkable
class SupportsClose(Protocol):
    """What holds resources until ``close()`` (an iterator, a generator, a file): a
    reader that drops it calls ``close()``, which is idempotent."""

    def close(self) -> None: ...


class NextIndexError(ValueError, NotImplementedError):
    """``get_next_index``/``set_next_index`` on an iterator that cannot know the index
    without processing the stream. A ``ValueError``, and a ``NotImplementedError`` as
    Grain raises there, so code written for either catches it."""


class DatasetIterator(Iterator[T], abc.ABC):
    """An iterator of an ``IterDataset``: elements, and a state to resume from.

    Subclasses define ``__next__``, ``get_state`` and ``set_state``; pass the parent
    iterators to ``__init__`` so that ``close`` and ``start_prefetch`` reach them.

    Args:
        parents: the iterators this one reads from (one, several, or none for a source).
    """

    # stats(): every DatasetIterator is a StatsParticipant (engine/stats/protocol.py
    # says what each member means); these are the defaults a subclass overrides.
    stats_clock: Clock | None = None
    stats_name: str | None = ""
    stats_batches: bool | None = None
    stats_exact: bool = False
    # What it declares to its readers (the device feed): close() may be called from
    # another thread while a next() runs in one, and ends that next() promptly.
    closes_from_any_thread: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        old = sorted(set(cls.__dict__) & _PUBLIC_NOW.keys())
        if old:
            raise TypeError(
                f"{cls.__qualname__} defines {old[0]}, a member the stats protocol no longer reads: "
                f"it is public now, name it {_PUBLIC_NOW[old[0]]}"
            )
        own = cls.__dict__.get("__next__")
        if own is not None and own not in _WRAPPED:
            cls.__next__ = _timed(own)  # type: ignore[method-assign, assignment]
        restore = cls.__dict__.get("set_state")
        if restore is not None and restore not in _WRAPPED:
            cls.set_state = _every_host_aware(restore)  # type: ignore[method-assign, assignment]

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

    def ready(self) -> int:
        """How many of the next ``next()`` calls return what this iterator already holds,
        computed, without waiting or computing (0: none, or it cannot tell).

        A thread that reads the iterator ahead (thread prefetch, ``mp_prefetch``) hands
        such outputs to its consumer together instead of one by one: a stage that
        receives its outputs in groups (units from a worker pool) says so here.
        """
        return 0

    def start_prefetch(self) -> None:
        """Starts producing elements before the first ``next()`` (where an ancestor can).

        Call it right after making the iterator (and ``set_state``), then restore the
        model: the first batches are made while the checkpoint loads. Idempotent.
        """
        for parent in self._parents:
            if hasattr(parent, "start_prefetch"):
                parent.start_prefetch()

    # Orbax v1's StatefulCheckpointable protocol, as Grain's iterators have it: Orbax
    # awaits save/load in its event loop and runs the coroutine each returns (not yet
    # awaited) in its background thread. The work is in dataloader.checkpoint, imported
    # here on first use, because it needs Orbax and JAX, which the engine never loads
    # itself (Orbax has loaded both when it calls these).

    async def save(self, directory: Any) -> Coroutine[Any, Any, None]:
        """Orbax v1: saves ``get_state()`` (taken now) to ``directory``.

        Writes ``process_<i>-of-<n>.json`` for this JAX process, as Grain does, once
        Orbax has created ``directory``; nothing is left half-written when that fails.

        Example:
            >>> from orbax.checkpoint import v1 as ocp             # doctest: +SKIP
            >>> ocp.save_checkpointables(path, {"iter": iterator})
        """
        from dataloader import checkpoint

        return checkpoint.v1_save(self, directory)

    async def load(self, directory: Any) -> Coroutine[Any, Any, None]:
        """Orbax v1: continues from the state saved in ``directory`` (by :meth:`save`,
        by Grain, or by the v0 handlers), when the returned coroutine runs.

        Example:
            >>> ocp.load_checkpointables(path, {"iter": iterator}) # doctest: +SKIP
        """
        from dataloader import checkpoint

        return checkpoint.v1_load(self, directory)

    def stats(self) -> dict[str, Any]:
        """Where the time went, in the shape every iterator shares (see docs/tuning.md,
        "Where the time goes"): the totals of the iterators under this one, this
        stage's own seconds, what it handed out, and the same over the last seconds."""
        return collect.stats_of(self)

    def add_stats_hook(self, callback: Hook, every_s: float = 10.0) -> None:
        """Calls ``callback(self.stats())`` every ``every_s`` seconds, from ``next()``.

        For sending the numbers to TensorBoard or Prometheus
        (:func:`~dataloader.engine.stats.flatten` makes them flat), or a log line
        (:func:`dataloader.log_stats`). The hook runs in the thread that calls
        ``next()``, between two elements; what it raises reaches that caller.
        """
        collect.clock_of(self).add_hook(callback, every_s)

    def stats_totals(self) -> dict[str, Any]:
        return collect.chain_totals(self)

    def stats_parents(self) -> Sequence[Any]:
        """The iterators whose totals this one adds up (its parents, by default)."""
        return self.parents

    @property
    def parents(self) -> tuple[Any, ...]:
        """The iterators this one reads (given to ``__init__``)."""
        return self.__dict__.get("_parents", ())

    def stats_pipeline(self) -> dict[str, Any]:
        return collect.chain_pipeline(self)

    def _get_next_index(self) -> int:
        """The index of the next element, where it is known without processing."""
        raise NextIndexError(
            f"{type(self).__name__} cannot tell the index of its next element without "
            f"processing the stream (Grain's get_next_index)"
        )

    def _set_next_index(self, index: int) -> None:
        raise NextIndexError(
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


def _timed(next_fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``next_fn`` (a subclass's ``__next__``) run under the iterator's stats clock."""

    @functools.wraps(next_fn)
    def __next__(self: Any) -> Any:
        if type(self).__next__ is not __next__:  # a subclass's __next__ calling its base's
            return next_fn(self)
        clock = self.stats_clock
        if clock is None:
            clock = collect.clock_of(self)
        return clock.call(self, next_fn)

    _WRAPPED.add(__next__)
    return __next__


def _every_host_aware(set_state: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
    """``set_state`` (a subclass's), with every old host's states (a list or tuple) sent
    to the restore room instead."""

    @functools.wraps(set_state)
    def wrapped(self: Any, state: Any) -> None:
        if isinstance(state, (list, tuple)):
            from dataloader.engine.restore.every_host import restore_every_host
            from dataloader.engine.restore.protocol import RestoresEveryHost

            if isinstance(self, RestoresEveryHost):  # a mixture hands each parent its states
                self.restore_every_host(list(state))
            else:
                restore_every_host(self, state)
        else:
            set_state(self, state)

    _WRAPPED.add(wrapped)
    return wrapped


# The functions the class hooks above made (a class that reuses one is not wrapped again).
_WRAPPED: set[Callable[..., Any]] = set()


def expect_state(state: Any, keys: Sequence[str], where: str) -> dict[str, Any]:
    """``state`` if it is a dict with ``keys``, else a :class:`StateMismatchError`.

    Args:
        state: what ``set_state`` was given.
        keys: the fields the iterator's ``get_state`` writes.
        where: the iterator's name, for the message.
    """
    if not isinstance(state, dict) or any(k not in state for k in keys):
        if is_grain_state(state):
            raise StateMismatchError(
                f"{where} was given a state written by Grain ({str(state)[:200]}); granary "
                f"continues Grain's dataset-iterator states only for a stream it can map "
                f"exactly ({{'next_index': n}} of an unpacked to_iter_dataset() in Grain's "
                f"order), not through this stage. Start this pipeline from its beginning "
                f"(or from a granary state), or restore the run with Grain"
            )
        raise StateMismatchError(
            f"expected a state of {where} (a dict with {list(keys)}), got {str(state)[:200]}; "
            f"restore with the state this pipeline's iterator returned"
        )
    return state
