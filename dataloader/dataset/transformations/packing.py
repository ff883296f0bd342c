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

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from dataloader.dataset.base import DatasetIterator, IterDataset
from dataloader.engine.stages.tail import stream_stage
from dataloader.operations.packing import BestFitPack, BOSHandling, ConcatThenSplit, FirstFitPack


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


class _FitPackIterDataset(PackIterDataset):
    """Grain's signature of the first-fit and best-fit datasets."""

    _packer: type = FirstFitPack

    def __init__(
        self,
        parent: IterDataset,
        *,
        length_struct: Any,
        num_packing_bins: int,
        seed: int = 0,
        shuffle_bins: bool = True,
        shuffle_bins_group_by_feature: str | None = None,
        meta_features: Sequence[str] = (),
        pack_alignment_struct: Any = None,
        padding_struct: Any = None,
        max_sequences_per_bin: int | None = None,
    ) -> None:
        super().__init__(parent, self._packer(
            length_struct, num_packing_bins, seed=seed, shuffle_bins=shuffle_bins,
            shuffle_bins_group_by_feature=shuffle_bins_group_by_feature,
            meta_features=meta_features, pack_alignment_struct=pack_alignment_struct,
            padding_struct=padding_struct, max_sequences_per_bin=max_sequences_per_bin,
        ))


class FirstFitPackIterDataset(_FitPackIterDataset):
    """First-fit packing (see :class:`~dataloader.operations.packing.FirstFitPack`)."""

    _packer = FirstFitPack


class BestFitPackIterDataset(_FitPackIterDataset):
    """Best-fit packing (see :class:`~dataloader.operations.packing.BestFitPack`)."""

    _packer = BestFitPack


class ConcatThenSplitIterDataset(PackIterDataset):
    """Concat-then-split packing (see :class:`~dataloader.operations.packing.ConcatThenSplit`)."""

    def __init__(
        self,
        parent: IterDataset,
        *,
        length_struct: Mapping[str, int],
        meta_features: Collection[str] = (),
        split_full_length_features: bool = True,
        bos_handling: BOSHandling = BOSHandling.DO_NOTHING,
        bos_features: Collection[str] = (),
        bos_token_id: int | None = None,
    ) -> None:
        super().__init__(parent, ConcatThenSplit(
            length_struct, meta_features=meta_features,
            split_full_length_features=split_full_length_features, bos_handling=bos_handling,
            bos_features=bos_features, bos_token_id=bos_token_id,
        ))
