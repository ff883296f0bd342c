"""``dl.experimental``: the names of ``grain.experimental``, on granary's engine.

Code written against ``grain.experimental`` runs with ``import dataloader as grain``.
Where granary's version differs on purpose, the README's Grain table says how.
"""

from __future__ import annotations

from dataloader.dataset.transformations.packing import (
    BestFitPackIterDataset,
    ConcatThenSplitIterDataset,
    FirstFitPackIterDataset,
)
from dataloader.dataset.transformations.prefetch import (
    ThreadPrefetchIterDataset,
    multithread_prefetch,
)
from dataloader.engine.stages.prefetch import ThreadPrefetchDatasetIterator
from dataloader.operations import FlatMapTransform, MapWithIndexTransform, batch_and_pad
from dataloader.operations.packing import BOSHandling

__all__ = [
    "BOSHandling",
    "BestFitPackIterDataset",
    "ConcatThenSplitIterDataset",
    "FirstFitPackIterDataset",
    "FlatMapTransform",
    "MapWithIndexTransform",
    "ThreadPrefetchDatasetIterator",
    "ThreadPrefetchIterDataset",
    "batch_and_pad",
    "multithread_prefetch",
]
