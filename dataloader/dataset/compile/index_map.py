"""Index-level transformations as vectorised maps from positions to record keys.

A chain of ``shuffle``, window shuffles, ``repeat``, ``slice``, ``mix``, ``concatenate``
and ``select_from_datasets`` over sources compiles to a tree of the nodes below.
``node.keys(positions)`` maps an int64 array of positions of that node's stream to
keys of the *concatenated* source (leaf ``j`` owns keys ``[offset_j, offset_j + n_j)``),
in O(1) time and memory per position: no node keeps a table of its length.
:class:`IndexMapSampler` puts a tree behind the sampler interface of the engine, with
the same interleaved sharding as ``IndexSampler``.

Epochs follow Grain's convention for random access: a position past a finite node's
``length`` is in a later epoch of that node. A leaf repeats its records, a shuffle draws
a new permutation per epoch, and a mixture simply keeps drawing, so each component
moves on to its own next epoch (its own new permutation) when it runs out.
"""

from __future__ import annotations

import hashlib
import json
import operator
from typing import Any

import numpy as np

from dataloader.dataset.compile.mixing import MixSchedule
from dataloader.dataset.compile.scheduled_mix import ScheduledMix
from dataloader.samplers import IndexSampler, NoSharding, ShardOptions
from dataloader.samplers.key_blocks import KeyBlocks
from dataloader.samplers.permutation import MAX_N
from dataloader.samplers.view import SamplerView


class Leaf:
    """One source (occurrence) of ``n`` records, whose keys start at ``offset``."""

    def __init__(self, offset: int, n: int) -> None:
        self.offset, self.length = offset, n
        self.shuffles = False

    def keys(self, pos: np.ndarray) -> np.ndarray:
        return self.offset + pos % self.length

    def describe(self) -> Any:
        return ["source", self.length]


class IndexedLeaf:
    """The source of a ``map_with_index``: its keys carry the whole position, epochs included.

    Grain passes ``map_with_index`` the index that reaches it, which past one pass (a
    ``repeat``, a shuffle's later epoch, random access past ``len``) is beyond its
    parent's length, and on an endless parent is unbounded. The key of position ``pos``
    is ``offset + pos % period + (pos // period) * total``: in ``[offset, offset + period)``
    within the first pass (``period``: its length, 1 when it is infinite), and a multiple
    of ``total`` (the key space of all sources, set once the tree is built) further for
    each later pass, so ``key % total`` still names the source and
    :class:`~dataloader.dataset.compile.concat_source.ConcatSource` recovers ``pos``.
    """

    def __init__(self, offset: int, length: int | None) -> None:
        self.offset, self.length = offset, length
        self.period = 1 if length is None else length
        self.total = self.period  # the key space; set by the builder once it is known
        self.shuffles = False

    def keys(self, pos: np.ndarray) -> np.ndarray:
        epoch, r = np.divmod(pos, self.period)
        return self.offset + r + epoch * self.total

    def describe(self) -> Any:
        return ["indexed_source", self.length]


class Shuffle:
    """A new permutation of the child's ``length`` positions in each epoch.

    ``permutation`` is the order (``IndexSampler``'s): ``"granary"`` or ``"grain"``
    (Grain's ``MapDataset.shuffle``: epoch ``e`` keyed by ``(seed + e) mod 2**32``).
    """

    def __init__(self, child: Any, seed: int, permutation: str = "granary") -> None:
        self.child, self.seed, self.length = child, seed, child.length
        self.permutation = permutation
        self.shuffles = True
        # An empty child has no position to permute (and IndexSampler needs records).
        self._sampler = IndexSampler(
            child.length, shuffle=True, seed=seed, num_epochs=None, permutation=permutation
        ) if child.length else None

    def keys(self, pos: np.ndarray) -> np.ndarray:
        n = self.length
        assert self._sampler is not None, "an empty dataset has no positions"
        return self.child.keys(pos - pos % n + self._sampler.record_keys(pos))

    def describe(self) -> Any:
        if self.permutation != "granary":  # the default's signature is as it always was
            return ["shuffle", self.seed, self.permutation, self.child.describe()]
        return ["shuffle", self.seed, self.child.describe()]


class WindowShuffle:
    """Each window of ``window_size`` positions permuted, a new permutation per window.

    Window ``w`` of epoch ``e`` (the last one of an epoch is the remainder, so each
    epoch is a permutation of the child's epoch) is permuted by the keyed permutation
    of ``(seed, e * windows_per_epoch + w)``, as ``WindowShuffleDatasetIterator``
    permutes its window of that number: one pass reads the same order either way.
    Over an infinite child every window is full and window ``w`` is ``pos // size``.
    """

    def __init__(self, child: Any, seed: int, size: int) -> None:
        self.child, self.seed, self.size, self.length = child, seed, size, child.length
        self.shuffles = True
        self._full = IndexSampler(size, shuffle=True, seed=seed, num_epochs=None)
        self._last: IndexSampler | None = None
        if self.length is not None:
            self._windows = -(-self.length // size)
            last = self.length - (self._windows - 1) * size
            if last != size:
                self._last = IndexSampler(last, shuffle=True, seed=seed, num_epochs=None)

    def keys(self, pos: np.ndarray) -> np.ndarray:
        size = self.size
        if self.length is None:
            return self.child.keys(pos - pos % size + self._full.record_keys(pos))
        epoch, offset = np.divmod(pos, self.length)
        window, r = np.divmod(offset, size)
        number = epoch * self._windows + window
        inner = np.empty_like(pos)
        short = window == self._windows - 1 if self._last is not None else np.zeros(pos.shape, bool)
        if (~short).any():
            inner[~short] = self._full.record_keys(number[~short] * size + r[~short])
        if short.any():
            assert self._last is not None
            last = self._last.num_records
            inner[short] = self._last.record_keys(number[short] * last + r[short])
        return self.child.keys(pos - r + inner)

    def describe(self) -> Any:
        return ["window_shuffle", self.seed, self.size, self.child.describe()]


class Repeat:
    """``num_epochs`` passes over the child (``None``: for ever)."""

    def __init__(self, child: Any, num_epochs: int | None) -> None:
        self.child, self.num_epochs = child, num_epochs
        # An empty child stays empty: no pass of it has a position to repeat.
        self.length = None if num_epochs is None and child.length != 0 else child.length * (num_epochs or 1)
        self.shuffles = child.shuffles

    def keys(self, pos: np.ndarray) -> np.ndarray:
        return self.child.keys(pos)

    def describe(self) -> Any:
        return ["repeat", self.num_epochs, self.child.describe()]


class Slice:
    """``range(start, stop, step)`` of the child's positions (normalised by the caller).

    For a finite child the slice is taken in every epoch of the child; for an infinite
    one ``stop=None`` keeps it infinite.
    """

    def __init__(self, child: Any, start: int, stop: int | None, step: int) -> None:
        self.child, self.start, self.stop, self.step = child, start, stop, step
        self.shuffles = child.shuffles
        self.length = None if stop is None else len(range(start, stop, step))

    def keys(self, pos: np.ndarray) -> np.ndarray:
        if self.length is None:
            return self.child.keys(self.start + pos * self.step)
        epoch, r = np.divmod(pos, self.length)
        inner = self.start + r * self.step
        if self.child.length is not None:
            inner = inner + epoch * self.child.length
        return self.child.keys(inner)

    def describe(self) -> Any:
        return ["slice", self.start, self.stop, self.step, self.child.describe()]


class Reindex:
    """Position ``i`` of a pass is the child's ``indices[i]``; pass ``e`` reads the child's
    epoch ``e`` (``indices[i] + e * len(child)``), as Grain's ``ReindexMapDataset`` does.

    ``indices`` is a ``range`` (computed, never stored) or an int64 array.
    """

    def __init__(self, child: Any, indices: Any) -> None:
        self.child, self.indices, self.length = child, indices, len(indices)
        self.shuffles = child.shuffles

    def keys(self, pos: np.ndarray) -> np.ndarray:
        epoch, r = np.divmod(pos, self.length)
        ind = self.indices
        inner = ind.start + r * ind.step if isinstance(ind, range) else ind[r]
        if self.child.length is not None:
            inner = inner + epoch * self.child.length
        return self.child.keys(inner)

    def describe(self) -> Any:
        ind = self.indices
        if isinstance(ind, range):
            what: Any = ["range", ind.start, ind.stop, ind.step]
        else:  # the indices themselves, folded: a state must not carry a long list
            what = hashlib.sha256(ind.tobytes()).hexdigest()[:16]
        return ["reindex", self.length, what, self.child.describe()]


class Concatenate:
    """The children one after another; each moves to its own next epoch on wrap-around."""

    def __init__(self, children: list[Any]) -> None:
        self.children = children
        lengths = [c.length for c in children]
        self.offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        self.length = int(self.offsets[-1])
        self.shuffles = any(c.shuffles for c in children)

    def keys(self, pos: np.ndarray) -> np.ndarray:
        epoch, r = np.divmod(pos, self.length)
        which = np.searchsorted(self.offsets, r, side="right") - 1
        out = np.empty_like(pos)
        for c in np.unique(which).tolist():
            where = which == c
            child = self.children[c]
            out[where] = child.keys(epoch[where] * child.length + r[where] - self.offsets[c])
        return out

    def describe(self) -> Any:
        return ["concatenate", [c.describe() for c in self.children]]


class Mix:
    """Interleaves the children by a :class:`MixSchedule` or a bound weight schedule
    (:class:`~dataloader.dataset.compile.scheduled_mix.ScheduledMix`).

    ``length`` (one pass) is the node's: Grain's ``MapDataset.mix`` length
    (:func:`mix_length`), or :func:`exhausted_length` for ``IterDataset.mix``; positions
    beyond keep drawing from the schedule.
    """

    def __init__(self, children: list[Any], schedule: MixSchedule | ScheduledMix, length: int | None) -> None:
        self.children, self.schedule = children, schedule
        self.shuffles = any(c.shuffles for c in children)
        self.length = length

    def keys(self, pos: np.ndarray) -> np.ndarray:
        comp, k = self.schedule.locate(pos)
        out = np.empty_like(pos)
        for c in np.unique(comp).tolist():
            where = comp == c
            out[where] = self.children[c].keys(k[where])
        return out

    def describe(self) -> Any:
        return ["mix", self.schedule.describe(), [c.describe() for c in self.children]]


class Select:
    """Position ``i`` of a pass is ``children[c]``'s position ``k`` for ``(c, k) = map[i]``.

    The map (Grain's ``DatasetSelectionMap``: ``__len__`` and ``__getitem__``) is asked
    only for indices of one pass, ``[0, length)``. Position ``i`` past the end is in
    pass ``e = i // length``: it selects as ``map[i % length]`` does, in epoch ``e`` of
    a finite component (its position ``k + e * len(component)``), so a repeated
    selection moves each component on to its next epoch (its next shuffle).
    """

    def __init__(self, children: list[Any], selection_map: Any, length: int) -> None:
        self.children, self.map, self.length = children, selection_map, length
        self.shuffles = any(c.shuffles for c in children)

    def keys(self, pos: np.ndarray) -> np.ndarray:
        epoch, r = np.divmod(pos, self.length)
        pairs = np.asarray([check_selection(self.map, int(i), len(self.children)) for i in r.tolist()],
                           dtype=np.int64).reshape(-1, 2)
        comp, k = pairs[:, 0], pairs[:, 1]
        out = np.empty_like(pos)
        for c in np.unique(comp).tolist():
            where = comp == c
            child = self.children[c]
            inner = k[where] if child.length is None else k[where] + epoch[where] * child.length
            out[where] = child.keys(inner)
        return out

    def describe(self) -> Any:
        # What the map selects (its first entries), not its repr, which may hold an address.
        head = [check_selection(self.map, i, len(self.children)) for i in range(min(self.length, 256))]
        digest = hashlib.sha256(json.dumps(head).encode()).hexdigest()[:16]
        name = type(self.map).__qualname__
        return ["select", name, self.length, digest, [c.describe() for c in self.children]]


def check_selection(selection_map: Any, index: int, count: int) -> tuple[int, int]:
    """``selection_map[index]`` as ``(dataset, index in it)``, checked.

    Raises:
        ValueError: the entry is not a pair of integers, names no dataset, or a negative
            index.
    """
    entry = selection_map[index]
    try:
        c, k = entry
        c, k = operator.index(c), operator.index(k)
    except (TypeError, ValueError):
        raise ValueError(
            f"selection_map[{index}] is {entry!r}; it must be a pair (dataset index, index "
            f"within that dataset) of integers"
        ) from None
    if not 0 <= c < count or k < 0:
        raise ValueError(
            f"selection_map[{index}] is {entry!r}; the dataset index must be in [0, {count}) "
            f"and the index within it >= 0"
        )
    return c, k


def mix_length(lengths: list[int | None], schedule: MixSchedule) -> int | None:
    """One pass of a ``MapDataset.mix``: Grain's length (None: no finite component with
    weight, so it never ends).

    Grain's ``int(min(len_c / (p_c / S)))`` (:meth:`MixSchedule.grain_map_length`), a
    few positions shorter than where the first component runs out, so that
    ``len(ds)`` and iteration end where Grain's do.
    """
    if all(n is None for n, p in zip(lengths, schedule.counts) if p):
        return None
    return schedule.grain_map_length(lengths)


def exhausted_length(lengths: list[int | None], schedule: MixSchedule) -> int | None:
    """Positions before the first component with weight is exhausted (None: never), where
    Grain's ``IterDataset.mix`` stops."""
    ends = [
        schedule.position_of(c, n)
        for c, n in enumerate(lengths)
        if n is not None and schedule.counts[c] > 0
    ]
    return min(ends) if ends else None


class IndexMapSampler(SamplerView):
    """The sampler interface the engine reads (as ``IndexSampler``'s) over an index tree.

    Local position ``p`` of shard ``h`` of ``H`` is global position ``p * H + h`` (the
    interleaved sharding of ``IndexSampler``), read through the tree. The tree's
    description is folded into ``index_map_signature``, which a state records so that
    a state of another mixture, slice or order is refused.
    """

    def __init__(
        self,
        index: Any,
        num_records: int,
        seed: int | None,
        shard_options: ShardOptions | None = None,
        *,
        endless: bool = False,
    ) -> None:
        self.index = index
        self.num_records = num_records
        self.seed = seed
        self.shuffle = bool(index.shuffles)
        self.shard_options = shard_options or NoSharding()
        self.num_epochs = None if index.length is None or endless else 1
        # endless: positions past one pass continue into the tree's later epochs (random
        # access past the end, as in Grain).
        self._stream = _stream(None if endless else index.length, self.shard_options)
        text = json.dumps(index.describe(), separators=(",", ":"))
        self.index_map_signature = (
            text if len(text) <= 160 else "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:24]
        )
        self._blocks = self._new_blocks()

    def _new_blocks(self) -> KeyBlocks | None:
        """A shuffled tree's keys are computed a block of positions at a time and kept
        (:mod:`~dataloader.samplers.key_blocks`); an unshuffled one's cost next to nothing."""
        if not self.shuffle:
            return None
        end = self._stream.num_positions
        return KeyBlocks(self._block_keys, len(self._stream) if end is None else end)

    def _block_keys(self, positions: np.ndarray) -> np.ndarray:
        return self.index.keys(self._stream.global_positions(positions))

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_blocks"] = None  # a cache, made anew where the sampler is unpickled
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._blocks = self._new_blocks()

    @property
    def num_positions(self) -> int | None:
        return self._stream.num_positions

    def __len__(self) -> int:
        return len(self._stream)

    def global_positions(self, positions: Any) -> np.ndarray:
        return self._stream.global_positions(positions)

    def record_keys(self, positions: Any) -> np.ndarray:
        """The view's :meth:`~dataloader.samplers.view.SamplerView.record_keys`, through
        the key blocks where they hold the positions (a run of local positions)."""
        if self._blocks is not None:
            flat = np.asarray(positions)
            if flat.size and flat.dtype.kind in "iu":
                flat = flat.astype(np.int64, copy=False).reshape(-1)
                low, high = int(flat.min()), int(flat.max())
                # Positions out of range take the path below, which names them.
                if low >= 0 and high < len(self._stream):
                    keys = self._blocks.keys(flat, low, high)
                    if keys is not None:
                        return keys.reshape(np.shape(positions))
        return super().record_keys(positions)

    def keys_at(self, global_positions: np.ndarray) -> np.ndarray:
        return self.index.keys(global_positions)

    def with_shard_options(self, shard_options: ShardOptions) -> IndexMapSampler:
        return IndexMapSampler(self.index, self.num_records, self.seed, shard_options)

    def __repr__(self) -> str:
        return (
            f"IndexMapSampler({self.index_map_signature}, num_records={self.num_records}, "
            f"shard_options={self.shard_options!r})"
        )


def _stream(length: int | None, shard_options: ShardOptions) -> IndexSampler:
    """An unshuffled ``IndexSampler`` whose global positions are the tree's, sharded.

    One epoch of ``length`` positions, or an endless stream; it checks positions and
    does the shard bookkeeping exactly as for a ``DataLoader``. A tree of no positions
    (a mix or concatenation of batched datasets that dropped their only, short, batch)
    gets a shard with none, so every position is out of range.

    Raises:
        ValueError: one pass is longer than the 2**63 positions a stream can address
            (as ``IndexSampler`` refuses for a plain chain).
    """
    if length is None:
        return IndexSampler(1, shard_options, num_epochs=None)
    if length > MAX_N:
        raise ValueError(
            f"one pass of this dataset has {length} positions, more than the 2**63 a "
            f"stream can address; repeat() it for ever rather than so many times"
        )
    if length == 0:
        return IndexSampler(1, ShardOptions(0, 2, drop_remainder=True), num_epochs=1)
    return IndexSampler(length, shard_options, num_epochs=1)
