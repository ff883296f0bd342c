"""The immutable tree behind a ``MapDataset``: one node per chained call.

Nodes only record what was asked for (and the length that results, in the node's own
units: elements, or batches after a ``batch``); :mod:`dataloader.dataset.compile` turns
a tree into what the engine runs. Their ``repr`` is the chain as the user wrote it, and
is stable across processes (no addresses), because it names a dataset in checkpoints'
error messages and in the ``repr`` of a dataset used as a source.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dataloader.dataset.compile.mixing import MixSchedule
from dataloader.dataset.compile.scheduled_mix import ScheduledMix
from dataloader.operations import Batch, Operation


@dataclasses.dataclass(frozen=True, eq=False)
class SourceNode:
    source: Any
    length: int
    user: bool = False  # a MapDataset of the user's own (read through its __getitem__)

    def __repr__(self) -> str:
        return f"MapDataset.source({self.source!r})"


@dataclasses.dataclass(frozen=True, eq=False)
class ShuffleNode:
    parent: Any
    seed: int
    length: int
    permutation: str = "granary"  # or "grain": Grain's order (see IndexSampler)

    def __repr__(self) -> str:
        if self.permutation != "granary":
            return f"{self.parent!r}.shuffle(seed={self.seed}, permutation={self.permutation!r})"
        return f"{self.parent!r}.shuffle(seed={self.seed})"


@dataclasses.dataclass(frozen=True, eq=False)
class WindowShuffleNode:
    parent: Any
    seed: int
    window_size: int
    length: int | None

    def __repr__(self) -> str:
        return f"WindowShuffleMapDataset({self.parent!r}, window_size={self.window_size}, seed={self.seed})"


@dataclasses.dataclass(frozen=True, eq=False)
class RepeatNode:
    parent: Any
    num_epochs: int | None
    length: int | None
    reseed_each_epoch: bool = True

    def __repr__(self) -> str:
        if not self.reseed_each_epoch:
            return f"{self.parent!r}.repeat({self.num_epochs}, reseed_each_epoch=False)"
        return f"{self.parent!r}.repeat({self.num_epochs})"


@dataclasses.dataclass(frozen=True, eq=False)
class SliceNode:
    parent: Any
    start: int
    stop: int | None
    step: int
    length: int | None

    def __repr__(self) -> str:
        stop = "" if self.stop is None else self.stop
        return f"{self.parent!r}[{self.start}:{stop}:{self.step}]"


@dataclasses.dataclass(frozen=True, eq=False)
class ReindexNode:
    """``slice(indices)``: position ``i`` is the parent's ``indices[i]`` (Grain's reindex).

    ``indices`` is a ``range`` (kept as one, so a long range costs nothing) or an int64
    array of non-negative parent indices.
    """

    parent: Any
    indices: Any
    length: int

    def __repr__(self) -> str:
        ind = self.indices
        if isinstance(ind, range):
            shown = repr(ind)
        elif len(ind) <= 5:
            shown = repr(ind.tolist())
        else:  # as Grain shows long index lists
            shown = f"[{ind[0]}, {ind[1]}, ..., {ind[-2]}, {ind[-1]}]"
        return f"{self.parent!r}.slice({shown}, len={self.length})"


@dataclasses.dataclass(frozen=True, eq=False)
class MixNode:
    parents: tuple[Any, ...]
    schedule: MixSchedule | ScheduledMix
    length: int | None

    def __repr__(self) -> str:
        inner = ", ".join(repr(p) for p in self.parents)
        return f"MapDataset.mix([{inner}], weights={self.schedule.describe()})"


@dataclasses.dataclass(frozen=True, eq=False)
class SelectNode:
    """``select_from_datasets``: position ``i`` is ``parents[c][k]`` for ``(c, k) = map[i]``."""

    parents: tuple[Any, ...]
    selection_map: Any
    length: int

    def __repr__(self) -> str:
        inner = ", ".join(repr(p) for p in self.parents)
        # The map's own repr may hold an address; this one is stable across processes.
        return f"MapDataset.select_from_datasets([{inner}], {type(self.selection_map).__qualname__}(len={self.length}))"


@dataclasses.dataclass(frozen=True, eq=False)
class ConcatNode:
    parents: tuple[Any, ...]
    length: int

    def __repr__(self) -> str:
        return f"MapDataset.concatenate([{', '.join(repr(p) for p in self.parents)}])"


@dataclasses.dataclass(frozen=True, eq=False)
class OpNode:
    """``map``, ``random_map`` or ``filter``: ``op`` is the engine operation to run."""

    parent: Any
    op: Operation
    length: int | None

    def __repr__(self) -> str:
        return f"{self.parent!r}.apply({self.op.name})"


@dataclasses.dataclass(frozen=True, eq=False)
class BatchNode:
    parent: Any
    batch: Batch
    length: int | None

    def __repr__(self) -> str:
        return f"{self.parent!r}.apply({self.batch.name})"


def is_batched(node: Any) -> bool:
    """Whether ``node``'s elements are batches (a ``batch`` with only element ops above)."""
    while isinstance(node, OpNode):
        node = node.parent
    return isinstance(node, BatchNode)


@dataclasses.dataclass(frozen=True, eq=False)
class FlatMapNode:
    """``flat_map`` on a ``MapDataset``: ``max_fan_out`` slots per parent element."""

    parent: Any
    op: Operation
    length: int | None

    def __repr__(self) -> str:
        return f"{self.parent!r}.flat_map({self.op.name})"


@dataclasses.dataclass(frozen=True, eq=False)
class WithIndexNode:
    """``map_with_index``: ``op(index, element)``, ``index`` the element's in ``parent``."""

    parent: Any
    op: Operation
    length: int | None

    def __repr__(self) -> str:
        return f"{self.parent!r}.map_with_index({self.op.name})"


_ONE_PARENT = (ShuffleNode, WindowShuffleNode, RepeatNode, SliceNode, ReindexNode, OpNode, BatchNode,
               FlatMapNode, WithIndexNode)
_SEVERAL_PARENTS = (MixNode, SelectNode, ConcatNode)


def children(node: Any) -> tuple[Any, ...]:
    """The nodes ``node`` reads: its ``parent``, its ``parents`` (a mixture, a selection, a
    concatenation), or none (a source)."""
    if isinstance(node, _ONE_PARENT):
        return (node.parent,)
    if isinstance(node, _SEVERAL_PARENTS):
        return tuple(node.parents)
    return ()


def has_user_dataset(node: Any) -> bool:
    """Whether a leaf of the tree is a ``MapDataset`` of the user's own."""
    if isinstance(node, SourceNode):
        return node.user
    return any(has_user_dataset(c) for c in children(node))


def reads_grains_order(node: Any) -> bool:
    """Whether the tree reads its indices in the order Grain's datasets would: every
    ``shuffle`` in Grain's order (``permutation="grain"``) and no window shuffle (ours
    permutes windows its own way). A Grain dataset-iterator state continues exactly only
    then (:mod:`dataloader.engine.restore.grain`)."""
    if isinstance(node, WindowShuffleNode) or (isinstance(node, ShuffleNode) and node.permutation != "grain"):
        return False
    return all(reads_grains_order(c) for c in children(node))
