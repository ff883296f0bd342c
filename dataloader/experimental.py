"""``dl.experimental``: the names of ``grain.experimental``, on granary's engine.

Code written against ``grain.experimental`` runs with ``import dataloader as grain``.
Where granary's version differs on purpose, the dataset table of docs/migrating-from-grain.md says how.
"""

from __future__ import annotations

from dataloader.dataset.context import WithOptionsIterDataset
from dataloader.dataset.device_put import device_put
from dataloader.dataset.experimental.cache import CacheIterDataset
from dataloader.dataset.experimental.elastic import ElasticIterator
from dataloader.dataset.experimental.limit import LimitIterDataset
from dataloader.dataset.experimental.performance import PerformanceConfig, pick_performance_config
from dataloader.dataset.experimental.rebatch import RebatchIterDataset
from dataloader.dataset.experimental.repeat import RepeatIterDataset
from dataloader.dataset.experimental.zip import ZipIterDataset, ZipMapDataset
from dataloader.dataset.streams import ParquetIterDataset, TFRecordIterDataset
from dataloader.dataset.transformations.apply import (
    ShapeDtypeStruct,
    apply_transformations,
    get_element_spec,
    get_next_index,
    set_next_index,
)
from dataloader.dataset.transformations.flat_map import FlatMapIterDataset, FlatMapMapDataset
from dataloader.dataset.transformations.interleave import InterleaveIterDataset
from dataloader.dataset.transformations.packing import (
    BestFitPackIterDataset,
    ConcatThenSplitIterDataset,
    FirstFitPackIterDataset,
)
from dataloader.dataset.transformations.prefetch import (
    ThreadPrefetchDatasetIterator,
    ThreadPrefetchIterDataset,
    multithread_prefetch,
)
from dataloader.dataset.transformations.window_shuffle import (
    WindowShuffleIterDataset,
    WindowShuffleMapDataset,
)
from dataloader.operations import FlatMapTransform, MapWithIndexTransform, batch_and_pad
from dataloader.operations.packing import BOSHandling, PackAndBatchOperation
from dataloader.options import DatasetOptions, ExecutionTrackingMode
from dataloader.samplers.index_shuffle import index_shuffle
from dataloader.testing import assert_equal_output_after_checkpoint

__all__ = [
    "BOSHandling",
    "BestFitPackIterDataset",
    "CacheIterDataset",
    "ConcatThenSplitIterDataset",
    "DatasetOptions",
    "ElasticIterator",
    "ExecutionTrackingMode",
    "FirstFitPackIterDataset",
    "FlatMapIterDataset",
    "FlatMapMapDataset",
    "FlatMapTransform",
    "InterleaveIterDataset",
    "LimitIterDataset",
    "MapWithIndexTransform",
    "PackAndBatchOperation",
    "ParquetIterDataset",
    "PerformanceConfig",
    "RebatchIterDataset",
    "RepeatIterDataset",
    "ShapeDtypeStruct",
    "TFRecordIterDataset",
    "ThreadPrefetchDatasetIterator",
    "ThreadPrefetchIterDataset",
    "WindowShuffleIterDataset",
    "WindowShuffleMapDataset",
    "WithOptionsIterDataset",
    "ZipIterDataset",
    "ZipMapDataset",
    "apply_transformations",
    "assert_equal_output_after_checkpoint",
    "batch_and_pad",
    "device_put",
    "get_element_spec",
    "get_next_index",
    "index_shuffle",
    "multithread_prefetch",
    "pick_performance_config",
    "set_next_index",
]
