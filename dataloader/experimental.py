"""``dl.experimental``: the names of ``grain.experimental``, on granary's engine.

Code written against ``grain.experimental`` runs with ``import dataloader as grain``.
Where granary's version differs on purpose, the README's Grain table says how.
"""

from __future__ import annotations

from dataloader.dataset.sources import ParquetIterDataset, TFRecordIterDataset
from dataloader.dataset.transformations.interleave import InterleaveIterDataset
from dataloader.dataset.transformations.packing import (
    BestFitPackIterDataset,
    ConcatThenSplitIterDataset,
    FirstFitPackIterDataset,
)
from dataloader.dataset.transformations.prefetch import (
    ThreadPrefetchIterDataset,
    multithread_prefetch,
)
from dataloader.dataset.transformations.window_shuffle import (
    WindowShuffleIterDataset,
    WindowShuffleMapDataset,
)
from dataloader.engine.stages.prefetch import ThreadPrefetchDatasetIterator
from dataloader.operations import FlatMapTransform, MapWithIndexTransform
from dataloader.operations.packing import BOSHandling

__all__ = [
    "BOSHandling",
    "BestFitPackIterDataset",
    "ConcatThenSplitIterDataset",
    "FirstFitPackIterDataset",
    "FlatMapTransform",
    "InterleaveIterDataset",
    "MapWithIndexTransform",
    "ParquetIterDataset",
    "TFRecordIterDataset",
    "ThreadPrefetchDatasetIterator",
    "ThreadPrefetchIterDataset",
    "WindowShuffleIterDataset",
    "WindowShuffleMapDataset",
    "multithread_prefetch",
]
