"""Grain's packing datasets: ``FirstFitPackIterDataset``, ``BestFitPackIterDataset`` and
``ConcatThenSplitIterDataset``, with Grain's names and arguments.

The algorithms are the packing operations of :mod:`dataloader.operations.packing` and the
stages of :mod:`dataloader.engine.stages.packing`: they run in the consumer's process on
the ordered stream, so unlike Grain's (where each worker packs its own slice) the rows
never depend on the number of workers, and a state resumes with one round (first-fit,
best-fit) or one element (concat-then-split) recomputed, never the stream replayed.

Example:
    >>> import numpy as np, dataloader as dl
    >>> ds = dl.MapDataset.source([[1, 2, 3], [4, 5], [6], [7, 8, 9, 10]]).map(
    ...     lambda t: {"tokens": np.asarray(t)}).to_iter_dataset()
    >>> rows = dl.experimental.ConcatThenSplitIterDataset(ds, length_struct={"tokens": 4})
    >>> [r["tokens"].tolist() for r in rows]
    [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 0, 0]]
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

from dataloader.dataset.base import DatasetIterator, IterDataset
from dataloader.engine.stages.tail import stream_stage
from dataloader.operations.packing import BestFitPack, ConcatThenSplit, FirstFitPack


class PackIterDataset(IterDataset):
    """The parent's stream through a stream operation (a packer: any of the three)."""

    def __init__(self, parent: IterDataset, packer: Any) -> None:
        if not isinstance(parent, IterDataset):
            raise TypeError(
                f"packing reads an IterDataset (e.g. ds.to_iter_dataset()), got {parent!r}"
            )
        super().__init__(parent)
        self.packer = packer

    def __iter__(self) -> DatasetIterator:
        return stream_stage(iter(self._parent), self.packer)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._parent!r}, {self.packer.name})"


def _grain_signature(packer: type) -> inspect.Signature:
    """Grain's signature of a packing dataset: ``parent``, then the packer's own
    parameters (names, annotations, defaults), all keyword-only."""
    parent = inspect.Parameter("parent", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation="IterDataset")
    own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in inspect.signature(packer).parameters.values()]
    return inspect.Signature([parent, *own], return_annotation="None")


class _PackerIterDataset(PackIterDataset):
    """A packing dataset whose arguments are its packer's, so they are written once (on
    the packer); ``inspect.signature`` and ``help`` show them as Grain's signature."""

    _packer: ClassVar[type]
    __signature__: ClassVar[inspect.Signature]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.__signature__ = _grain_signature(cls._packer)

    def __init__(self, parent: IterDataset, **kwargs: Any) -> None:
        # Checked here, so an unknown or missing argument is named as this dataset's.
        signature = type(self).__signature__
        unknown = sorted(set(kwargs) - set(signature.parameters))
        if unknown:
            raise TypeError(
                f"{type(self).__name__}() got unknown arguments {unknown}; "
                f"it takes {list(signature.parameters)}"
            )
        try:
            signature.bind(parent, **kwargs)
        except TypeError as error:
            raise TypeError(f"{type(self).__name__}(): {error}") from None
        super().__init__(parent, self._packer(**kwargs))


class FirstFitPackIterDataset(_PackerIterDataset):
    """First-fit packing (see :class:`~dataloader.operations.packing.FirstFitPack`)."""

    _packer = FirstFitPack


class BestFitPackIterDataset(_PackerIterDataset):
    """Best-fit packing (see :class:`~dataloader.operations.packing.BestFitPack`)."""

    _packer = BestFitPack


class ConcatThenSplitIterDataset(_PackerIterDataset):
    """Concat-then-split packing (see :class:`~dataloader.operations.packing.ConcatThenSplit`)."""

    _packer = ConcatThenSplit
