"""Element-wise calls (map, random map, filter, flat map, batch) at the iterator level.

Chained after an iterator-level stage (packing, interleaving, a user's dataset, ...),
``map``/``filter``/``batch`` cannot run on the engine, which computes positions. Under
``mp_prefetch`` (or ``GRANARY_WORKER_COUNT``) the element-wise calls run on the worker
pool, unit by unit over the parent's ordered stream
(:mod:`dataloader.dataset.transformations.pooled`); otherwise they run in the
consumer's process, element by element, through the stage iterators of
:mod:`dataloader.engine.stages.elementwise` (which say how states and random
generators work there). A batch stays in the consumer's process on the ordered stream.
"""

from __future__ import annotations

from typing import Any

from dataloader.dataset.base import DatasetIterator, IterDataset
from dataloader.dataset.context import inherited_options, inherited_workers
from dataloader.dataset.transformations.apply import get_next_index, set_next_index
from dataloader.engine.stages.elementwise import BatchIterator, ElementwiseIterator
from dataloader.engine.stats import FilterWatch
from dataloader.operations import (
    Batch,
    MapWithIndexTransform,
    Operation,
)
from dataloader.operations.transforms import GROUP
from dataloader.options import DatasetOptions


class SeedScope(IterDataset):
    """The parent's stream, under a seed of its own for the random calls that follow."""

    def __init__(self, parent: IterDataset) -> None:
        super().__init__(parent)

    def __iter__(self) -> DatasetIterator:
        return iter(self._parent)

    def __repr__(self) -> str:
        return f"{self._parent!r}.seed({self._seed})"


def then(parent: IterDataset, op: Operation | Batch) -> IterDataset:
    """``parent`` followed by ``op`` at the iterator level (merging element-wise calls).

    A ``map_with_index`` after a filter or flat map starts a stage of its own, so that its
    index counts the elements that reach it.
    """
    if op.runs == GROUP:
        return BatchIterDataset(parent, op)
    if type(parent) is ElementwiseIterDataset and not (op.needs_index and parent.reshapes):
        merged = ElementwiseIterDataset(parent.parents[0], (*parent.ops, op))
        merged._seed, merged._seed_uses = parent._seed, parent._seed_uses
        return merged
    return ElementwiseIterDataset(parent, (op,))


# The name the base class imports.
OperationIterDataset = then


class ElementwiseIterDataset(IterDataset):
    """One or more element-wise operations over the parent's stream."""

    def __init__(self, parent: IterDataset, ops: tuple[Operation, ...]) -> None:
        super().__init__(parent)
        self.ops = ops
        self.reshapes = any(op.reshapes for op in ops)

    def __iter__(self) -> DatasetIterator:
        from dataloader.dataset.transformations.pooled import PooledElementwiseIterator, can_ship

        found = inherited_workers()
        parent = iter(self._parent)
        if found is not None and can_ship(self.ops):
            # Under mp_prefetch (0 workers included): unit by unit, on the pool.
            options, init_fn = found
            return PooledElementwiseIterator(parent, self.ops, options, init_fn, watch=self._filter_watch())
        return _StateReadingIterator(parent, self.ops, watch=self._filter_watch())

    def _filter_watch(self) -> FilterWatch | None:
        """Grain's filter thresholds over this stage."""
        return FilterWatch.for_operations(self.ops, inherited_options() or DatasetOptions())

    def __repr__(self) -> str:
        return f"{self._parent!r}" + "".join(f".apply({op.name})" for op in self.ops)


class _StateReadingIterator(ElementwiseIterator):
    """The element-by-element stage, which also continues from a state of the pooled
    one (same keys; there ``skip`` counts outputs of the unit that starts at element
    ``index``, so it may run past that element's outputs): it restores the element's
    state and hands out ``skip`` outputs again. For its own states (``skip`` within one
    element) that is what the stage does anyway, so a state saves and restores alike
    with and without worker processes."""

    def set_state(self, state: dict[str, Any]) -> None:
        skip = int(state["skip"]) if isinstance(state, dict) and "skip" in state else 0
        super().set_state({**state, "skip": 0} if skip else state)
        for _ in range(skip):
            try:
                ElementwiseIterator.__next__(self)
            except StopIteration:
                break

    # Grain's get_next_index / set_next_index: where every parent element gives one
    # output (no filter or flat map here), the next index is the parent's, and a
    # map_with_index's index is the count of parent elements consumed.
    def _get_next_index(self) -> int:
        if self.reshapes:
            return super()._get_next_index()
        return get_next_index(self._parent)

    def _set_next_index(self, index: int) -> None:
        if self.reshapes:
            super()._set_next_index(index)
            return
        set_next_index(self._parent, index)
        self.restart_at(index)


class BatchIterDataset(IterDataset):
    """Consecutive elements of the parent's stream, grouped by a :class:`Batch`."""

    def __init__(self, parent: IterDataset, batch: Batch) -> None:
        super().__init__(parent)
        self.batch_op = batch

    @property
    def batched_by(self) -> Batch:
        return self.batch_op

    def __iter__(self) -> BatchIterator:
        return BatchIterator(iter(self._parent), self.batch_op)

    def __repr__(self) -> str:
        return f"{self._parent!r}.apply({self.batch_op.name})"


def with_index(transform: Any) -> MapWithIndexTransform:
    """``transform`` (a function of ``(index, element)``) as a ``MapWithIndexTransform``."""
    if isinstance(transform, MapWithIndexTransform):
        return transform
    if not callable(transform):
        raise TypeError(
            f"map_with_index() needs a function of (index, element) or a "
            f"MapWithIndexTransform, got {transform!r}"
        )
    return MapWithIndexTransform(transform)
