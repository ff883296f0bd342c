"""``ZipMapDataset`` and ``ZipIterDataset``: tuples of the elements of several datasets.

``ZipMapDataset([a, b])[i]`` is ``(a[i], b[i])``. It is a ``MapDataset`` like any
other (shuffle it, batch it, ``to_iter_dataset()`` it onto the engine): each parent
becomes a random-access source of its own elements (computed by the same functions a
worker uses), and the zip is a source of tuples over them.

``ZipIterDataset([a, b])`` pulls one element from each parent stream per tuple, in the
consumer's process; its state is the list of the parents' states. ``strict=True`` (the
default, as in Grain) raises a ``ValueError`` when one parent ends before the others.

Example:
    >>> import dataloader as dl
    >>> a, b = dl.MapDataset.range(3), dl.MapDataset.range(10, 13)
    >>> list(dl.experimental.ZipMapDataset([a, b]))
    [(0, 10), (1, 11), (2, 12)]
    >>> list(dl.experimental.ZipIterDataset([a.to_iter_dataset(), b.to_iter_dataset()]))
    [(0, 10), (1, 11), (2, 12)]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dataloader.dataset.base import DatasetIterator, IterDataset
from dataloader.dataset.compile import nodes as nd
from dataloader.dataset.compile.lower import NodeSource
from dataloader.dataset.experimental.checks import as_iter_dataset
from dataloader.dataset.map_dataset import MapDataset, _combined_fields
from dataloader.engine.stages.base import expect_state
from dataloader.errors import StateMismatchError
from dataloader.options import check_bool
from dataloader.sources import read_records


class ZipSource:
    """A random-access source whose record ``i`` is the tuple of record ``i`` of each part."""

    def __init__(self, parts: Sequence[Any]) -> None:
        self.parts = tuple(parts)

    def __len__(self) -> int:
        return len(self.parts[0])

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        return tuple(part[index] for part in self.parts)

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[Any, ...]]:
        columns = [read_records(part, indices) for part in self.parts]
        return list(zip(*columns))

    def __repr__(self) -> str:
        return f"ZipMapDataset([{', '.join(repr(p) for p in self.parts)}])"


def _as_source(ds: MapDataset) -> Any:
    """The parent's elements as a random-access source (its own source when it is one)."""
    node = ds._node
    return node.source if isinstance(node, nd.SourceNode) else NodeSource(node)


class ZipMapDataset(MapDataset):
    """Tuples of the elements at the same index of ``parents`` (all of one length).

    Args:
        parents: ``MapDataset`` s of equal, finite length (zip before ``repeat()``).

    Raises:
        ValueError: no parents, an infinite parent, or lengths that differ.
        TypeError: a parent that is not a ``MapDataset``.
    """

    def __init__(self, parents: Sequence[MapDataset]) -> None:
        parents = list(parents)
        if not parents:
            raise ValueError("ZipMapDataset needs at least one parent dataset")
        for i, p in enumerate(parents):
            if not isinstance(p, MapDataset):
                raise TypeError(
                    f"ZipMapDataset: parents[{i}] is {p!r}, expected a MapDataset (use "
                    f"ZipIterDataset for IterDatasets)"
                )
            if p._node.length is None:
                raise ValueError(
                    f"ZipMapDataset: parents[{i}] ({p!r}) is infinite; zip finite datasets "
                    f"and repeat() the zip: ZipMapDataset([...]).repeat()"
                )
        lengths = [len(p) for p in parents]
        if len(set(lengths)) != 1:
            raise ValueError(
                f"ZipMapDataset needs parents of one length, got lengths {lengths}; slice "
                f"them to the same length first (ds[:n])"
            )
        source = ZipSource([_as_source(p) for p in parents])
        super().__init__(tuple(parents))
        # A node of the chain (not a dataset read through __getitem__): it compiles.
        self._chain_node = nd.SourceNode(source, lengths[0])
        self._seed, self._seed_uses, self._filtered = _combined_fields(parents)


class ZipIterDataset(IterDataset):
    """Tuples of the next element of each parent stream.

    Args:
        parents: the streams (``MapDataset`` s are read through ``to_iter_dataset()``).
        strict: raise a ``ValueError`` if the parents do not end together (as Grain
            and Python's ``zip(strict=True)``); with ``False`` the zip ends with the
            shortest parent.

    Raises:
        ValueError: no parents.
        TypeError: a parent is not a dataset, or ``strict`` is not a bool.
    """

    def __init__(self, parents: Sequence[IterDataset], *, strict: bool = True) -> None:
        parents = list(parents)
        if not parents:
            raise ValueError("ZipIterDataset needs at least one parent dataset")
        super().__init__([as_iter_dataset(p, f"ZipIterDataset parents[{i}]") for i, p in enumerate(parents)])
        self._strict = check_bool("ZipIterDataset strict", strict)

    def __iter__(self) -> ZipDatasetIterator:
        return ZipDatasetIterator([iter(p) for p in self._parents], strict=self._strict)

    def __repr__(self) -> str:
        inner = ", ".join(repr(p) for p in self._parents)
        return f"ZipIterDataset([{inner}], strict={self._strict})"


class ZipDatasetIterator(DatasetIterator):
    """Pulls one element from each parent per tuple; its state is the parents' states."""

    def __init__(self, parents: Sequence[DatasetIterator], *, strict: bool) -> None:
        super().__init__(list(parents))
        self._strict = strict

    def __next__(self) -> tuple[Any, ...]:
        items = []
        for i, parent in enumerate(self._parents):
            try:
                items.append(next(parent))
            except StopIteration:
                if self._strict:
                    self._check_all_ended(i)
                raise
        return tuple(items)

    def _check_all_ended(self, ended: int) -> None:
        """Python's strict-zip check: parent ``ended`` ran out first; did the others?"""
        if ended > 0:
            raise ValueError(_strict_error(ended, "shorter"))
        for i in range(1, len(self._parents)):
            try:
                next(self._parents[i])
            except StopIteration:
                continue
            raise ValueError(_strict_error(i, "longer"))

    def get_state(self) -> dict[str, Any]:
        return {"parents": [p.get_state() for p in self._parents]}

    def set_state(self, state: dict[str, Any]) -> None:
        state = expect_state(state, ("parents",), "ZipIterDataset")
        if len(state["parents"]) != len(self._parents):
            raise StateMismatchError(
                f"this state holds {len(state['parents'])} parent states but the zip has "
                f"{len(self._parents)} parents; restore into a zip of the same datasets"
            )
        for parent, parent_state in zip(self._parents, state["parents"]):
            parent.set_state(parent_state)


def _strict_error(i: int, why: str) -> str:
    """Python's wording for ``zip(strict=True)``: argument ``i + 1`` against those before."""
    before = "argument 1" if i == 1 else f"arguments 1-{i}"
    return f"ZipIterDataset argument {i + 1} is {why} than {before}; pass strict=False to stop at the shortest"
