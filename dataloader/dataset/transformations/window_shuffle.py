"""Grain's window shuffles: ``WindowShuffleMapDataset`` and ``WindowShuffleIterDataset``.

Both cut the stream into windows of ``window_size`` consecutive elements and hand each
window out in the order of the keyed permutation :func:`~dataloader.samplers.permute`
of ``(seed, window number)``: a local shuffle, for data read in order (files shuffled
and interleaved, rows window-shuffled), that costs one window of memory at most.

* ``WindowShuffleMapDataset`` is an index map (:class:`~dataloader.dataset.compile.
  index_map.WindowShuffle`): ``ds[i]`` costs O(1), nothing is held in memory, it
  compiles onto the engine like ``shuffle()`` (worker processes, O(1) states) and every
  epoch draws new permutations. Each epoch ends with a shorter window, the remainder,
  so an epoch is a permutation of the parent's epoch (Grain's last window can reach
  past the end).
* ``WindowShuffleIterDataset`` reads its parent's stream, one window in memory
  (:class:`WindowShuffleDatasetIterator` below says how its state and restore work).
  Over a stream on the engine (``MapDataset...to_iter_dataset()`` with maps, filters,
  flat maps), its states also name the window's elements already handed out as the
  engine's positions, so they restore on another host count (docs/elastic-restore.md):
  through ``ElasticIterator``'s ``set_shard_states``, or ``set_state`` with every old
  host's states.

On one pass the two give the same order: window ``w`` is permuted by ``(seed, w)`` in
both. Grain keys window ``w`` with ``seed + w``, so its windows of seed ``s`` repeat
those of seed ``s + 1`` shifted by one; ours are unrelated, and the orders differ from
Grain's.

Example:
    >>> import dataloader as dl
    >>> ds = dl.experimental.WindowShuffleMapDataset(dl.MapDataset.range(8), window_size=4, seed=0)
    >>> [sorted(ds[w * 4:(w + 1) * 4]) for w in range(2)]
    [[0, 1, 2, 3], [4, 5, 6, 7]]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dataloader.dataset.arguments import SHUFFLE_BITS, check_seed, check_size
from dataloader.dataset.base import DatasetIterator, IterDataset
from dataloader.dataset.compile import nodes as nd
from dataloader.dataset.map_dataset import MapDataset
from dataloader.engine.restore.protocol import ElasticDefaults, StatePart, tag_reader
from dataloader.engine.stages.base import expect_state
from dataloader.engine.stages.packing import held_part, used_of
from dataloader.errors import StateMismatchError
from dataloader.samplers import permute


def window_order(size: int, seed: int, window: int) -> list[int]:
    """The order in which a window of ``size`` elements is handed out."""
    if size <= 1:
        return list(range(size))
    return permute(np.arange(size), size, seed, window).tolist()


class WindowShuffleDatasetIterator(DatasetIterator, ElasticDefaults):
    """Hands out the parent's elements window by window, each window permuted.

    It reads the next ``window_size`` elements of its parent (fewer at the end of the
    stream) and hands them out in the order of :func:`window_order`, a permutation keyed
    by ``(seed, window number)``, so the order never depends on timing or restores.
    Memory: one window of elements. State: the parent's state before the window, the
    window's number and how many of its elements were handed out; once a window is
    handed out, the state moves to the start of the next one. A restore re-reads that
    one window (at most ``window_size - 1`` elements read again), never the stream.

    Over the engine's element stream, a state inside a window also names the elements
    handed out as ``"used": [[position, sub, null], ...]`` (the engine's local positions),
    so an elastic restore (``set_state`` with every old host's states; it is an
    :class:`~dataloader.engine.restore.protocol.ElasticStage`) reads the window's other
    elements again on the new hosts, whose windows start empty.
    """

    def __init__(self, parent: DatasetIterator, window_size: int, seed: int) -> None:
        super().__init__(parent)
        self._size = window_size
        self._seed = seed
        self._window = 0  # number of the current window (or of the next, between windows)
        self._start: Any = None  # the parent's state before the current window
        self._elements: list[Any] = []  # the current window, in the order handed out
        self._tags: list[Any] = []  # the engine's (position, sub) of each, in that order
        self._given = 0
        self._ended = False
        self._parent_tag = tag_reader(parent)

    def _fill(self) -> None:
        self._start = self._parent.get_state()
        elements, tags = [], []
        for _ in range(self._size):
            try:
                elements.append(next(self._parent))
            except StopIteration:
                self._ended = True
                break
            tags.append(self._parent_tag())
        order = window_order(len(elements), self._seed, self._window)
        self._elements = [elements[k] for k in order]
        self._tags = [tags[k] for k in order]
        self._given = 0

    def __next__(self) -> Any:
        if self._given >= len(self._elements):
            if self._elements:  # the window is handed out: the next one starts
                self._window += 1
                self._elements, self._given = [], 0
            if self._ended:
                raise StopIteration
            self._fill()
            if not self._elements:
                raise StopIteration
        element = self._elements[self._given]
        self._given += 1
        return element

    def get_state(self) -> dict[str, Any]:
        if self._elements and self._given < len(self._elements):
            parent, window, given = self._start, self._window, self._given
        else:  # between windows: the state of the next window's start
            parent = self._parent.get_state()
            window, given = self._window + (1 if self._elements else 0), 0
        state = {"parent": parent, "window_index": window, "pos_in_window": given,
                 "window_size": self._size, "seed": self._seed}
        if given:
            used = used_of([(tag, None) for tag in self._tags[:given]])
            if used is not None:
                state["used"] = used
        return state

    def last_tag(self) -> Any:
        """The engine's (position, sub) of the element handed out last (None: unknown), so
        a packer over this shuffle names its rows' elements for an elastic restore."""
        return self._tags[self._given - 1] if self._given else None

    def split_state(self, state: Any) -> StatePart:
        expect_state(state, ("parent", "window_index", "pos_in_window"), "a window shuffle")
        return held_part(state, {"pos_in_window": state["pos_in_window"]}, "a window shuffle")

    def restart_elastic(self, resume: Callable[[], None], kept: Sequence[Any]) -> None:
        resume()
        self._window, self._elements, self._tags, self._given, self._ended = 0, [], [], 0, False

    def set_state(self, state: Any) -> None:
        expect_state(state, ("parent", "window_index", "pos_in_window"), "a window shuffle")
        saved = (state.get("window_size"), state.get("seed"))
        if saved != (self._size, self._seed):
            raise StateMismatchError(
                f"this state was saved by a window shuffle with window_size={saved[0]} and "
                f"seed={saved[1]} but this one has window_size={self._size} and seed="
                f"{self._seed}; restore with the arguments the state was made for"
            )
        self._parent.set_state(state["parent"])
        self._window = int(state["window_index"])
        self._elements, self._given, self._ended = [], 0, False
        given = int(state["pos_in_window"])
        if given:
            self._fill()
            self._given = min(given, len(self._elements))


class WindowShuffleMapDataset(MapDataset):
    """``parent`` shuffled within windows of ``window_size`` elements (random access).

    Args:
        parent: the ``MapDataset`` to shuffle.
        window_size: elements per window (a window longer than the dataset shuffles
            the whole epoch).
        seed: the permutations' key.

    Raises:
        ValueError: ``window_size`` is not a positive integer, or ``seed`` is not a
            non-negative integer.
        TypeError: ``parent`` is not a ``MapDataset``.
    """

    def __init__(self, parent: MapDataset, *, window_size: int, seed: int) -> None:
        if not isinstance(parent, MapDataset):
            raise TypeError(
                f"WindowShuffleMapDataset shuffles a MapDataset, got {parent!r}; for a stream "
                f"use WindowShuffleIterDataset"
            )
        size = check_size(window_size, "window_size")
        node = nd.WindowShuffleNode(parent._node, check_seed(seed, "seed", bits=SHUFFLE_BITS), size, parent._node.length)
        super().__init__(parent)
        # A node of the chain (not a dataset read through __getitem__): it compiles.
        self._chain_node = node
        self._seed, self._seed_uses, self._filtered = parent._seed, parent._seed_uses, parent._filtered


class WindowShuffleIterDataset(IterDataset):
    """``parent``'s stream shuffled within windows of ``window_size`` elements.

    Args:
        parent: the ``IterDataset`` to shuffle.
        window_size: elements per window, all held in memory at once.
        seed: the permutations' key.

    Raises:
        ValueError: ``window_size`` is not a positive integer, or ``seed`` is not a
            non-negative integer.
        TypeError: ``parent`` is not an ``IterDataset``.

    Example:
        >>> import dataloader as dl
        >>> ds = dl.MapDataset.range(6).to_iter_dataset()
        >>> out = list(dl.experimental.WindowShuffleIterDataset(ds, window_size=3, seed=1))
        >>> sorted(out[:3]), sorted(out[3:])
        ([0, 1, 2], [3, 4, 5])
    """

    def __init__(self, parent: IterDataset, *, window_size: int, seed: int) -> None:
        if not isinstance(parent, IterDataset):
            hint = (" (WindowShuffleMapDataset shuffles a MapDataset; or call to_iter_dataset() "
                    "first)") if isinstance(parent, MapDataset) else ""
            raise TypeError(f"WindowShuffleIterDataset reads an IterDataset, got {parent!r}{hint}")
        super().__init__(parent)
        self.window_size = check_size(window_size, "window_size")
        self.window_seed = check_seed(seed, "seed", bits=SHUFFLE_BITS)

    def __iter__(self) -> DatasetIterator:
        return WindowShuffleDatasetIterator(iter(self._parent), self.window_size, self.window_seed)

    @property
    def stage_operation(self) -> WindowShuffle:
        """This shuffle as a stream operation of a ``DataLoader`` (ElasticIterator's path)."""
        return WindowShuffle(self.window_size, self.window_seed)

    def __repr__(self) -> str:
        return (f"WindowShuffleIterDataset({self._parent!r}, window_size={self.window_size}, "
                f"seed={self.window_seed})")


class WindowShuffle:
    """The window shuffle as a stream operation of a ``DataLoader``: a stage over the
    engine's ordered elements (``operations.transforms.STREAM``), run by
    :class:`WindowShuffleStage`. ``ElasticIterator`` builds it from a
    ``WindowShuffleIterDataset``."""

    runs = "stream"  # operations.transforms.STREAM
    stage = "dataloader.dataset.transformations.window_shuffle:WindowShuffleStage"
    name = "WindowShuffle"

    def __init__(self, window_size: int, seed: int) -> None:
        self.window_size = check_size(window_size, "window_size")
        self.seed = check_seed(seed, "seed", bits=SHUFFLE_BITS)

    def describe(self) -> dict[str, Any]:
        return {"window_shuffle": True, "window_size": self.window_size, "seed": self.seed}

    def __repr__(self) -> str:
        return f"WindowShuffle(window_size={self.window_size}, seed={self.seed})"


class WindowShuffleStage(WindowShuffleDatasetIterator):
    """:class:`WindowShuffleDatasetIterator` as the stage of a :class:`WindowShuffle`."""

    def __init__(self, parent: DatasetIterator, op: WindowShuffle) -> None:
        super().__init__(parent, op.window_size, op.seed)
