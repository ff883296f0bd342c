"""``RebatchIterDataset``: batches of a new size cut from a stream of batches, as in Grain.

Batches are cut and joined as arrays, never unbatched into elements: each output leaf
is one slice of a parent batch (no copy) or one ``numpy.concatenate`` of slices. A
batch is any nest of dicts, tuples (named tuples too) and lists whose leaves are
arrays sharing one leading (batch) dimension, such as ``.batch(n)`` makes.

The state is the parent's state before the batch being cut and how many of its rows
were handed out, so a restore reads that one parent batch again, never more.

Example:
    >>> import dataloader as dl
    >>> ds = dl.MapDataset.range(7).batch(3).to_iter_dataset()
    >>> [b.tolist() for b in dl.experimental.RebatchIterDataset(ds, batch_size=2)]
    [[0, 1], [2, 3], [4, 5], [6]]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dataloader.dataset.arguments import check_size
from dataloader.dataset.base import DatasetIterator, IterDataset
from dataloader.dataset.experimental.checks import as_iter_dataset
from dataloader.engine.stages.base import expect_state
from dataloader.errors import PipelineError
from dataloader.options import check_bool


class RebatchIterDataset(IterDataset):
    """Re-cuts the parent's batches into batches of ``batch_size`` rows.

    Args:
        parent: a stream of batches (leaves with a leading batch dimension).
        batch_size: rows per output batch, a positive integer.
        drop_remainder: drop a last batch with fewer rows.

    Raises:
        ValueError: ``batch_size`` is not a positive integer.
        TypeError: ``drop_remainder`` is not a bool.
    """

    def __init__(self, parent: IterDataset, batch_size: int, drop_remainder: bool = False) -> None:
        super().__init__(as_iter_dataset(parent, "RebatchIterDataset"))
        self._batch_size = check_size(batch_size, "RebatchIterDataset batch_size")
        self._drop_remainder = check_bool("RebatchIterDataset drop_remainder", drop_remainder)

    def __iter__(self) -> RebatchDatasetIterator:
        return RebatchDatasetIterator(iter(self._parent), self._batch_size, self._drop_remainder)

    def __repr__(self) -> str:
        return (
            f"RebatchIterDataset({self._parent!r}, batch_size={self._batch_size}, "
            f"drop_remainder={self._drop_remainder})"
        )


def flatten(tree: Any) -> tuple[list[Any], Any]:
    """The leaves of a nest of dicts, tuples and lists, and its structure (comparable)."""
    leaves: list[Any] = []

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            return (dict, tuple(node), tuple(walk(v) for v in node.values()))
        if isinstance(node, (tuple, list)):
            return (type(node), len(node), tuple(walk(v) for v in node))
        leaves.append(node)
        return None

    return leaves, walk(tree)


def unflatten(structure: Any, leaves: list[Any]) -> Any:
    """The nest of ``structure`` with ``leaves`` in order (the inverse of :func:`flatten`)."""
    it = iter(leaves)

    def build(spec: Any) -> Any:
        if spec is None:
            return next(it)
        kind, shape, children = spec
        values = [build(c) for c in children]
        if kind is dict:
            return dict(zip(shape, values))
        if kind is not tuple and issubclass(kind, tuple) and hasattr(kind, "_fields"):
            return kind(*values)
        return kind(values)

    return build(structure)


class RebatchDatasetIterator(DatasetIterator):
    """Cuts the parent's batches (see the module docstring)."""

    def __init__(self, parent: DatasetIterator, batch_size: int, drop_remainder: bool) -> None:
        super().__init__(parent)
        self._batch_size, self._drop = batch_size, drop_remainder
        self._structure: Any = None  # of the first batch; every batch must share it
        self._leaves: list[np.ndarray] | None = None  # the batch being cut
        self._rows = 0  # its rows
        self._offset = 0  # its rows handed out
        self._before: Any = None  # the parent's state before it
        self._skip = 0  # rows to pass over in the next batch (a restore)

    def __next__(self) -> Any:
        need, pieces = self._batch_size, []
        while need:
            if (self._leaves is None or self._offset >= self._rows) and not self._read():
                break
            take = min(need, self._rows - self._offset)
            assert self._leaves is not None
            pieces.append([leaf[self._offset : self._offset + take] for leaf in self._leaves])
            self._offset += take
            need -= take
        if not pieces or (need and self._drop):
            raise StopIteration
        if len(pieces) == 1:
            return unflatten(self._structure, pieces[0])
        joined = [np.concatenate(column, axis=0) for column in zip(*pieces)]
        return unflatten(self._structure, joined)

    def _read(self) -> bool:
        """Moves to the parent's next non-empty batch; False at the end of the stream."""
        while True:
            before = self._parent.get_state()
            try:
                batch = next(self._parent)
            except StopIteration:
                self._leaves, self._skip = None, 0
                return False
            leaves, structure = flatten(batch)
            if self._structure is None:
                self._structure = structure
            elif structure != self._structure:
                raise _error("a batch whose structure differs from the first batch's", batch)
            arrays = [np.asarray(leaf) for leaf in leaves]
            sizes = {a.shape[0] if a.ndim else None for a in arrays}
            if not arrays or None in sizes or len(sizes) != 1:
                raise _error(
                    "a batch whose leaves do not share one leading (batch) dimension "
                    f"(sizes {sorted(str(s) for s in sizes)})", batch
                )
            rows = int(sizes.pop() or 0)
            if rows == 0:
                continue  # nothing to hand out; Grain refuses empty batches
            self._leaves, self._rows, self._before = arrays, rows, before
            self._offset, self._skip = self._skip, 0
            return True

    def get_state(self) -> dict[str, Any]:
        if self._leaves is not None and self._offset < self._rows:
            return {"parent": self._before, "offset": self._offset}
        return {"parent": self._parent.get_state(), "offset": self._skip}

    def set_state(self, state: dict[str, Any]) -> None:
        state = expect_state(state, ("parent", "offset"), "RebatchIterDataset")
        self._parent.set_state(state["parent"])
        self._leaves, self._rows, self._offset = None, 0, 0
        self._skip = int(state["offset"])


def _error(what: str, batch: Any) -> PipelineError:
    return PipelineError(
        f"RebatchIterDataset got {what}: {str(batch)[:200]}; rebatch a stream of batches "
        f"made by .batch(n) (dicts, tuples or lists of arrays with one batch dimension)",
        operation="RebatchIterDataset",
    )
