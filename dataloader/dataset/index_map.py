"""Index-level transformations as vectorised maps from positions to record keys.

A chain of ``shuffle``, ``repeat``, ``slice``, ``mix`` and ``concatenate`` over sources
compiles to a tree of the nodes below. ``node.keys(positions)`` maps an int64 array of
positions of that node's stream to keys of the *concatenated* source (leaf ``j`` owns
keys ``[offset_j, offset_j + n_j)``), in O(1) time and memory per position: no node
keeps a table of its length. :class:`IndexMapSampler` puts a tree behind the sampler
interface of the engine, with the same interleaved sharding as ``IndexSampler``.

Epochs follow Grain's convention for random access: a position past a finite node's
``length`` is in a later epoch of that node. A leaf repeats its records, a shuffle draws
a new permutation per epoch, and a mixture simply keeps drawing, so each component
moves on to its own next epoch (its own new permutation) when it runs out.
"""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Any

import numpy as np

from dataloader.dataset.mixing import MixSchedule
from samplers import IndexSampler, NoSharding, ShardOptions
from samplers.sharding import shard_length

_INT64_MAX = 2**63 - 1


class Leaf:
    """One source (occurrence) of ``n`` records; ``offset`` is set once all leaves are known."""

    def __init__(self, leaf_id: int, n: int) -> None:
        self.leaf_id, self.length, self.offset = leaf_id, n, 0
        self.shuffles = False

    def keys(self, pos: np.ndarray) -> np.ndarray:
        return self.offset + pos % self.length

    def describe(self) -> Any:
        return ["source", self.length]


class Shuffle:
    """A new permutation of the child's ``length`` positions in each epoch."""

    def __init__(self, child: Any, seed: int) -> None:
        self.child, self.seed, self.length = child, seed, child.length
        self.shuffles = True
        self._sampler = IndexSampler(child.length, shuffle=True, seed=seed, num_epochs=None)

    def keys(self, pos: np.ndarray) -> np.ndarray:
        n = self.length
        return self.child.keys(pos - pos % n + self._sampler.record_keys(pos))

    def describe(self) -> Any:
        return ["shuffle", self.seed, self.child.describe()]


class Repeat:
    """``num_epochs`` passes over the child (``None``: for ever)."""

    def __init__(self, child: Any, num_epochs: int | None) -> None:
        self.child, self.num_epochs = child, num_epochs
        self.length = None if num_epochs is None else child.length * num_epochs
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
    """Interleaves the children by a :class:`MixSchedule`.

    ``length`` (one pass) ends where the first finite component with weight would run
    out, as in Grain; positions beyond keep drawing from the schedule.
    """

    def __init__(self, children: list[Any], schedule: MixSchedule) -> None:
        self.children, self.schedule = children, schedule
        self.shuffles = any(c.shuffles for c in children)
        self.length = mix_length([c.length for c in children], schedule)

    def keys(self, pos: np.ndarray) -> np.ndarray:
        comp, k = self.schedule.locate(pos)
        out = np.empty_like(pos)
        for c in np.unique(comp).tolist():
            where = comp == c
            out[where] = self.children[c].keys(k[where])
        return out

    def describe(self) -> Any:
        return ["mix", self.schedule.describe(), [c.describe() for c in self.children]]


def mix_length(lengths: list[int | None], schedule: MixSchedule) -> int | None:
    """Positions before the first component with weight is exhausted (None: never)."""
    ends = [
        schedule.position_of(c, n)
        for c, n in enumerate(lengths)
        if n is not None and schedule.counts[c] > 0
    ]
    return min(ends) if ends else None


class IndexMapSampler:
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
    ) -> None:
        self.index = index
        self.num_records = num_records
        self.seed = seed
        self.shuffle = bool(index.shuffles)
        self.shard_options = shard_options or NoSharding()
        self.num_epochs = None if index.length is None else 1
        h, count = self.shard_options.shard_index, self.shard_options.shard_count
        self._h, self._count = h, count
        if index.length is None:
            self.num_positions = None
            self._end = (_INT64_MAX - h) // count + 1
        else:
            self.num_positions = shard_length(index.length, h, count, self.shard_options.drop_remainder)
            self._end = self.num_positions
        text = json.dumps(index.describe(), separators=(",", ":"))
        self.index_map_signature = (
            text if len(text) <= 160 else "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:24]
        )

    def __len__(self) -> int:
        return sys.maxsize if self.num_positions is None else self.num_positions

    def _check(self, positions: Any) -> np.ndarray:
        flat = np.asarray(positions, dtype=np.int64).reshape(-1)
        if flat.size and (flat.min() < 0 or flat.max() >= self._end):
            bad = int(flat.min()) if flat.min() < 0 else int(flat.max())
            raise IndexError(f"position {bad} is outside this stream of {self.num_positions} positions")
        return flat

    def global_positions(self, positions: Any) -> np.ndarray:
        return self._check(positions) * self._count + self._h

    def record_keys(self, positions: Any) -> np.ndarray:
        shape = np.shape(positions)
        return self.index.keys(self.global_positions(positions)).reshape(shape)

    def with_shard_options(self, shard_options: ShardOptions) -> IndexMapSampler:
        return IndexMapSampler(self.index, self.num_records, self.seed, shard_options)

    def describe(self) -> dict[str, Any]:
        return {
            "kind": type(self).__name__,
            "num_records": self.num_records,
            "index_map": self.index_map_signature,
            "seed": self.seed,
            "shard_index": self._h,
            "shard_count": self._count,
            "drop_remainder": self.shard_options.drop_remainder,
        }

    def __repr__(self) -> str:
        return (
            f"IndexMapSampler({self.index_map_signature}, num_records={self.num_records}, "
            f"shard_options={self.shard_options!r})"
        )
