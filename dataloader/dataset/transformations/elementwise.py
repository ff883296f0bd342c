"""Element-wise calls (map, random map, filter, flat map, batch) at the iterator level.

Chained after an iterator-level stage (packing, interleaving, a user's dataset, ...),
``map``/``filter``/``batch`` cannot run on the engine, which computes positions; they
run here, in the consumer's process, on the ordered stream of the parent.

Consecutive element-wise calls share one stage, as on the engine: element ``i`` of the
parent stream carries the tags ``(i, sub)`` (``sub`` numbers the outputs of a flat map)
and a random map draws from ``record_rng(seed, i, operation number, sub)``. The state
is the parent's state plus the count of parent elements consumed; after a flat map whose
outputs are only partly handed out, it is the parent's state *before* that element and
how many of its outputs were handed out (restoring recomputes one element).
"""

from __future__ import annotations

from typing import Any

from dataloader.dataset.base import DatasetIterator, IterDataset
from dataloader.errors import PipelineError
from dataloader.operations import (
    Batch,
    FilterTransform,
    FlatMapTransform,
    MapWithIndexTransform,
    Operation,
    RandomMapTransform,
)
from dataloader.samplers import RecordRngFactory


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
    if isinstance(op, Batch):
        return BatchIterDataset(parent, op)
    if type(parent) is ElementwiseIterDataset and not (
        isinstance(op, MapWithIndexTransform) and parent.reshapes
    ):
        merged = ElementwiseIterDataset(parent._parent, (*parent.ops, op))
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
        self.reshapes = any(isinstance(op, (FilterTransform, FlatMapTransform)) for op in ops)

    def __iter__(self) -> ElementwiseIterator:
        return ElementwiseIterator(iter(self._parent), self.ops)

    def __repr__(self) -> str:
        return f"{self._parent!r}" + "".join(f".apply({op.name})" for op in self.ops)


class ElementwiseIterator(DatasetIterator):
    """Pulls one parent element at a time and runs the operations on it."""

    def __init__(self, parent: DatasetIterator, ops: tuple[Operation, ...]) -> None:
        super().__init__(parent)
        self._ops = [(op, op.element_fn(), _rngs(op, stream)) for stream, op in enumerate(ops)]
        self._expands = any(isinstance(op, FlatMapTransform) for op in ops)
        self._index = 0  # parent elements consumed
        self._pending: list[Any] = []  # outputs of the last parent element not yet handed out
        self._given = 0  # outputs of the last parent element handed out
        self._before: Any = None  # the parent's state before the last element (flat maps)

    def __next__(self) -> Any:
        while not self._pending:
            if self._expands:
                self._before = self._parent.get_state()
            element = next(self._parent)
            self._index += 1
            self._pending = self._apply(element, self._index - 1)
            self._given = 0
        self._given += 1
        return self._pending.pop(0)

    def _apply(self, element: Any, index: int) -> list[Any]:
        items: list[tuple[Any, int]] = [(element, 0)]
        for op, fn, rngs in self._ops:
            out: list[tuple[Any, int]] = []
            for x, sub in items:
                try:
                    if isinstance(op, FilterTransform):
                        if fn(x):
                            out.append((x, sub))
                    elif isinstance(op, FlatMapTransform):
                        start = len(out)
                        out += [(y, start + j) for j, y in enumerate(op.checked_flat_map(x))]
                    elif rngs is not None:
                        out.append((fn(x, rngs(index, sub)), sub))
                    elif isinstance(op, MapWithIndexTransform):
                        out.append((fn(index, x), sub))
                    else:
                        out.append((fn(x), sub))
                except Exception as exc:
                    raise PipelineError(
                        f"{op.name} failed on element {index} of the stream of {self._parent!r}"
                        f"{f' (output {sub})' if sub else ''}: {type(exc).__name__}: {exc}",
                        operation=op.name,
                        position=index,
                    ) from exc
            items = out
        return [x for x, _ in items]

    def get_state(self) -> dict[str, Any]:
        if self._pending:
            return {"parent": self._before, "index": self._index - 1, "skip": self._given}
        return {"parent": self._parent.get_state(), "index": self._index, "skip": 0}

    def set_state(self, state: dict[str, Any]) -> None:
        self._parent.set_state(state["parent"])
        self._index, skip = int(state["index"]), int(state["skip"])
        self._pending, self._given = [], 0
        if skip:
            self._before = state["parent"]
            self._pending = self._apply(next(self._parent), self._index)
            self._index += 1
            del self._pending[:skip]
            self._given = skip


def _rngs(op: Operation, stream: int) -> RecordRngFactory | None:
    if not isinstance(op, RandomMapTransform):
        return None
    if op.rng_seed is None:
        raise ValueError(f"{op.name} has no seed; give the random map a seed (rng_seed)")
    return RecordRngFactory(op.rng_seed, stream)


class BatchIterDataset(IterDataset):
    """Consecutive elements of the parent's stream, grouped by a :class:`Batch`."""

    def __init__(self, parent: IterDataset, batch: Batch) -> None:
        super().__init__(parent)
        self.batch_op = batch

    def __iter__(self) -> BatchIterator:
        return BatchIterator(iter(self._parent), self.batch_op)

    def __repr__(self) -> str:
        return f"{self._parent!r}.apply({self.batch_op.name})"


class BatchIterator(DatasetIterator):
    """Pulls ``batch_size`` elements and stacks them; its state is the parent's."""

    def __init__(self, parent: DatasetIterator, batch: Batch) -> None:
        super().__init__(parent)
        self._batch = batch
        self._end: Any = None  # the parent's state where the stream ended

    def __next__(self) -> Any:
        if self._end is not None:
            raise StopIteration
        # A dropped remainder hands nothing out, so the state stays where it was.
        start = self._parent.get_state() if self._batch.drop_remainder else None
        elements = []
        for _ in range(self._batch.batch_size):
            try:
                elements.append(next(self._parent))
            except StopIteration:
                break
        if not elements or (self._batch.drop_remainder and len(elements) < self._batch.batch_size):
            self._end = start if start is not None else self._parent.get_state()
            raise StopIteration
        try:
            return self._batch.batch_fn(elements)
        except Exception as exc:
            raise PipelineError(
                f"{self._batch.name} failed on a batch of the stream of {self._parent!r}: "
                f"{type(exc).__name__}: {exc}",
                operation=self._batch.name,
            ) from exc

    def get_state(self) -> dict[str, Any]:
        return {"parent": self._end if self._end is not None else self._parent.get_state()}

    def set_state(self, state: dict[str, Any]) -> None:
        self._parent.set_state(state["parent"])
        self._end = None


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
