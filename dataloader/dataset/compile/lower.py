"""Compiles a ``MapDataset`` tree into what ``DataLoader`` runs: source, sampler, operations.

This is what puts the chained API on the loader's engine rather than beside it:

* **Index-level calls** (``shuffle``, ``repeat``, ``slice``, ``mix``, ``concatenate``,
  ``WindowShuffleMapDataset``, ``select_from_datasets``)
  compose into one vectorised map from stream positions to keys of the concatenated
  sources (:mod:`~dataloader.dataset.compile.index_map`), behind the sampler interface. The
  plain chains ``source[.shuffle()][.repeat(k)]`` compile to an ``IndexSampler`` itself,
  so they are a ``DataLoader`` exactly: same order, same states.
* **Element-level calls** (``map``, ``random_map``, ``filter``, ``batch``) become the
  loader's operations, in data-flow order. ``map``/``filter``/``random_map`` act on one
  element at a time, so they commute with index-level calls: ``.map(f).shuffle()``
  runs ``f`` after the reordering, with identical results. An operation below a
  ``mix``/``concatenate`` that concerns only some components is restricted to their
  elements (:mod:`~dataloader.dataset.compile.wrappers`).
* A ``batch`` with an index-level call above it (``.batch(4).shuffle()``, mixing
  batches) cannot be a loader ``Batch`` over consecutive positions; that sub-chain
  becomes a random-access source of its own (:class:`NodeSource`, computed by the same
  functions) and the index-level call runs over its batches.

Random maps draw from ``record_rng(seed, g, operation number, ...)`` where ``g`` is the
position in the stream the chain compiles to (inside a :class:`NodeSource`, in that
source's stream), so augmentation never depends on worker count or restores.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from dataloader.dataset.compile import index_map as im
from dataloader.dataset.compile import nodes as nd
from dataloader.dataset.compile.concat_source import ConcatSource
from dataloader.dataset.compile.fanout import FanOutSource, WithIndexSource
from dataloader.dataset.compile.wrappers import DropNone, Untag, none_passing, tagged
from dataloader.engine.compute import compute_unit
from dataloader.engine.plan import Plan, make_plan
from dataloader.operations import Batch, Operation
from dataloader.operations.transforms import KEEP
from dataloader.samplers import IndexSampler


@dataclasses.dataclass
class _Lowered:
    index: Any
    parts: frozenset[int]
    ops: list[tuple[Operation, frozenset[int]]]
    batch: Batch | None = None
    post: list[Operation] = dataclasses.field(default_factory=list)


class _Builder:
    def __init__(self) -> None:
        self.sources: list[Any] = []
        self.num_records = 0  # of the sources so far: where the next one's keys start
        self.indexed: dict[int, im.IndexedLeaf] = {}  # part -> its leaf, whose keys carry epochs

    def leaf(self, source: Any, length: int) -> _Lowered:
        part = len(self.sources)
        self.sources.append(source)
        leaf = im.Leaf(self.num_records, length)
        self.num_records += length
        return _Lowered(leaf, frozenset([part]), [])

    def indexed_leaf(self, source: Any, length: int | None) -> _Lowered:
        """A ``map_with_index`` or ``flat_map`` sub-chain, whose keys carry the whole
        position (Grain reads its parent at that index)."""
        part = len(self.sources)
        self.sources.append(source)
        leaf = self.indexed[part] = im.IndexedLeaf(self.num_records, length)
        self.num_records += leaf.period
        return _Lowered(leaf, frozenset([part]), [])

    def finish(self) -> frozenset[int]:
        """Tells the indexed leaves the size of the key space; returns their parts."""
        for leaf in self.indexed.values():
            leaf.total = self.num_records
        return frozenset(self.indexed)

    def as_leaf(self, node: Any) -> _Lowered:
        """A batched sub-chain as one source of its batches."""
        src = NodeSource(node)
        low = self.leaf(src, len(src))
        if _may_yield_none(node):
            low.ops.append((DropNone(), low.parts))
        return low

    def lower(self, node: Any) -> _Lowered:
        if isinstance(node, nd.SourceNode):
            return self.leaf(node.source, node.length)
        if isinstance(node, nd.WithIndexNode):
            low = self.indexed_leaf(WithIndexSource(node.parent, node.op), node.length)
            if _may_yield_none(node.parent):
                low.ops.append((DropNone(), low.parts))
            return low
        if isinstance(node, nd.FlatMapNode):
            # Grain's layout: max_fan_out slots per parent element, holes read as None.
            low = self.indexed_leaf(FanOutSource(node.parent, node.op), node.length)
            low.ops.append((DropNone(), low.parts))
            return low
        if isinstance(node, nd.OpNode):
            low = self.lower(node.parent)
            if low.batch is None:
                low.ops.append((node.op, low.parts))
            else:
                low.post.append(node.op)
            return low
        if isinstance(node, nd.BatchNode):
            parent = node.parent  # a batch of batches reads the inner batches as a source
            low = self.as_leaf(parent) if nd.is_batched(parent) else self.lower(parent)
            low.batch = node.batch
            return low
        if isinstance(node, nd.RepeatNode) and not node.reseed_each_epoch:
            # Every pass is the first: the sub-chain below is a source read by its own
            # positions (its shuffles and random maps never see a later epoch).
            low = self.as_leaf(node.parent)
            return _Lowered(im.Repeat(low.index, node.num_epochs), low.parts, low.ops)
        children = nd.children(node)
        lowered = [self.as_leaf(c) if nd.is_batched(c) else self.lower(c) for c in children]
        indices = [c.index for c in lowered]
        if isinstance(node, nd.ShuffleNode):
            index: Any = im.Shuffle(indices[0], node.seed, node.permutation)
        elif isinstance(node, nd.WindowShuffleNode):
            index = im.WindowShuffle(indices[0], node.seed, node.window_size)
        elif isinstance(node, nd.RepeatNode):
            index = im.Repeat(indices[0], node.num_epochs)
        elif isinstance(node, nd.SliceNode):
            index = im.Slice(indices[0], node.start, node.stop, node.step)
        elif isinstance(node, nd.ReindexNode):
            index = im.Reindex(indices[0], node.indices)
        elif isinstance(node, nd.MixNode):
            index = im.Mix(indices, node.schedule, node.length)
        elif isinstance(node, nd.SelectNode):
            index = im.Select(indices, node.selection_map, node.length)
        else:
            assert isinstance(node, nd.ConcatNode), node
            index = im.Concatenate(indices)
        ops = [op for c in lowered for op in c.ops]
        return _Lowered(index, frozenset().union(*(c.parts for c in lowered)), ops)


def _may_yield_none(node: Any) -> bool:
    """Whether reading ``node``'s items can give ``None``: a filter's or a flat map's holes
    anywhere below it, through maps and index-level calls (a slice or a repeat of a
    filtered dataset keeps its holes)."""
    if isinstance(node, nd.OpNode) and node.op.returns == KEEP:
        return True
    if isinstance(node, nd.FlatMapNode):
        return True
    return any(_may_yield_none(c) for c in nd.children(node))


def _canonical_sampler(index: Any, seed: int | None) -> IndexSampler | None:
    """An ``IndexSampler`` equal to ``index`` when there is one (then it *is* a DataLoader)."""
    epochs: int | None = 1
    if isinstance(index, im.Repeat):
        epochs, index = index.num_epochs, index.child
    shuffle_seed, permutation = None, "granary"
    if isinstance(index, im.Shuffle):
        shuffle_seed, permutation, index = index.seed, index.permutation, index.child
    if not isinstance(index, im.Leaf) or index.length == 0:
        return None  # an empty leaf has no IndexSampler (it needs records): the index map
    if shuffle_seed is not None:
        return IndexSampler(index.length, shuffle=True, seed=shuffle_seed, num_epochs=epochs,
                            permutation=permutation)
    return IndexSampler(index.length, shuffle=False, seed=seed, num_epochs=epochs)


@dataclasses.dataclass(frozen=True)
class Compiled:
    """A chain as the engine runs it.

    Attributes:
        source, sampler, operations: the arguments of a ``DataLoader``.
        batch_size: the ``Batch``'s size, or ``None``.
    """

    source: Any
    sampler: Any
    operations: tuple[Operation, ...]
    batch_size: int | None
    endless_sampler: Any = None  # the sampler read on past one pass (random access)
    drop_remainder: bool = False

    @functools.cached_property
    def plan(self) -> Plan:
        return make_plan(self.source, self.sampler, list(self.operations))

    @functools.cached_property
    def _item_plan(self) -> Plan:
        return make_plan(self.source, self.endless_sampler or self.sampler, list(self.operations))

    def item(self, index: int) -> Any:
        """The element (or batch) at ``index``; ``None`` where a filter dropped it.

        Past one pass, the index is in a later epoch (a shuffle reshuffles), as in Grain;
        batches keep each epoch's layout (the last one of an epoch may be short).
        """
        if self.batch_size is None:
            start, stop = index, index + 1
        else:
            per_epoch, batches = self.sampler.num_positions, None
            if per_epoch is not None:
                batches = (per_epoch // self.batch_size if self.drop_remainder
                           else -(-per_epoch // self.batch_size))
            if batches:
                epoch, j = divmod(index, batches)
                start = epoch * per_epoch + j * self.batch_size
                stop = epoch * per_epoch + min((j + 1) * self.batch_size, per_epoch)
            else:
                start = index * self.batch_size
                stop = start + self.batch_size
        outputs = compute_unit(self._item_plan, start, stop).outputs
        return outputs[0] if outputs else None

    def items(self, indices: Any) -> list[Any]:
        """:meth:`item` of each index, computing each run of consecutive indices as one
        unit (one batched read and one pass of the operations, not one per index)."""
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        if self.batch_size is not None or len(indices) < 2:
            return [self.item(i) for i in indices.tolist()]
        out: list[Any] = []
        for run in np.split(indices, np.flatnonzero(np.diff(indices) != 1) + 1):
            start, stop = int(run[0]), int(run[-1]) + 1
            result = compute_unit(self._item_plan, start, stop)
            got: list[Any] = [None] * (stop - start)
            if result.positions is None:
                got[: len(result.outputs)] = result.outputs
            else:  # a filter dropped some: the rest are at their positions (first output each)
                for position, value in reversed(list(zip(result.positions.tolist(), result.outputs))):
                    got[position - start] = value
            out += got
        return out


def compile_node(node: Any, seed: int | None) -> Compiled:
    """Compiles a dataset tree; ``seed`` is the chain's seed (the sampler's, for states)."""
    builder = _Builder()
    low = builder.lower(node)
    unbounded = builder.finish()
    everything = frozenset(range(len(builder.sources)))
    is_tagged = any(parts != everything for _, parts in low.ops)
    ops = low.ops
    if nd.has_user_dataset(node):  # its None elements pass the functions untouched
        ops = [(none_passing(op), parts) for op, parts in ops]
    operations: list[Any] = [tagged(op, parts) if is_tagged else op for op, parts in ops]
    if is_tagged:
        operations.append(Untag())
    if low.batch is not None:
        operations += [low.batch, *low.post]
    sampler: Any = None if len(builder.sources) > 1 else _canonical_sampler(low.index, seed)
    if sampler is None:
        sampler = im.IndexMapSampler(low.index, builder.num_records, seed)
        endless = im.IndexMapSampler(low.index, builder.num_records, seed, endless=True)
    else:
        endless = IndexSampler(sampler.num_records, shuffle=sampler.shuffle, seed=sampler.seed,
                               num_epochs=None, permutation=sampler.permutation)
    if len(builder.sources) == 1 and not is_tagged:  # its keys start at 0: no wrapper needed
        source = builder.sources[0]
    else:
        source = ConcatSource(builder.sources, tagged=is_tagged, unbounded=unbounded)
    batch_size = low.batch.batch_size if low.batch is not None else None
    drop = low.batch is not None and low.batch.drop_remainder
    return Compiled(source, sampler, tuple(operations), batch_size, endless, drop)


class NodeSource:
    """A (finite) dataset tree as a random-access source: ``source[i]`` is its ``i``-th item.

    Items dropped by a filter read as ``None``.
    """

    def __init__(self, node: Any) -> None:
        if node.length is None:
            raise ValueError(
                f"{node!r} is infinite and batched, so it cannot be shuffled, sliced, mixed "
                f"or concatenated; batch after those steps, or repeat after the batch"
            )
        self.node = node

    @functools.cached_property
    def compiled(self) -> Compiled:
        return compile_node(self.node, None)

    def __len__(self) -> int:
        return self.node.length

    def __getitem__(self, index: int) -> Any:
        index = int(index)
        if not 0 <= index < self.node.length:
            raise IndexError(f"index {index} is out of range for {len(self)} items")
        return self.compiled.item(index)

    def __getitems__(self, indices: Any) -> list[Any]:
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        bad = indices[(indices < 0) | (indices >= self.node.length)]
        if len(bad):
            raise IndexError(f"index {int(bad[0])} is out of range for {len(self)} items")
        return self.compiled.items(indices)

    def __repr__(self) -> str:
        return repr(self.node)

