"""``dl.experimental``: the names of ``grain.experimental``, on granary's engine.

Code written against ``grain.experimental`` runs with ``import dataloader as grain``.
Where granary's version differs on purpose, the README's Grain table says how.
"""

from __future__ import annotations

from dataloader.dataset.experimental.cache import CacheIterDataset
from dataloader.dataset.experimental.elastic import ElasticIterator
from dataloader.dataset.experimental.limit import LimitIterDataset
from dataloader.dataset.experimental.rebatch import RebatchIterDataset
from dataloader.dataset.experimental.repeat import RepeatIterDataset
from dataloader.dataset.experimental.zip import ZipIterDataset, ZipMapDataset
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
from dataloader.operations import FlatMapTransform, MapWithIndexTransform
from dataloader.operations.packing import BOSHandling, PackAndBatchOperation
from dataloader.samplers.index_shuffle import index_shuffle
from dataloader.testing import assert_equal_output_after_checkpoint

__all__ = [
    "BOSHandling",
    "BestFitPackIterDataset",
    "CacheIterDataset",
    "ConcatThenSplitIterDataset",
    "ElasticIterator",
    "FirstFitPackIterDataset",
    "FlatMapTransform",
    "LimitIterDataset",
    "MapWithIndexTransform",
    "PackAndBatchOperation",
    "RebatchIterDataset",
    "RepeatIterDataset",
    "ThreadPrefetchDatasetIterator",
    "ThreadPrefetchIterDataset",
    "ZipIterDataset",
    "ZipMapDataset",
    "assert_equal_output_after_checkpoint",
    "index_shuffle",
    "multithread_prefetch",
]
