"""``dl.experimental``: the names of ``grain.experimental``, on granary's engine.

Code written against ``grain.experimental`` runs with ``import dataloader as grain``.
Where granary's version differs on purpose, the README's Grain table says how.
"""

from __future__ import annotations

from dataloader.dataset.context import WithOptionsIterDataset
from dataloader.dataset.device_put import device_put
from dataloader.dataset.sources import ParquetIterDataset, TFRecordIterDataset
from dataloader.dataset.transformations.apply import (
    ShapeDtypeStruct,
    apply_transformations,
    get_element_spec,
    get_next_index,
    set_next_index,
)
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
from dataloader.operations import FlatMapTransform, MapWithIndexTransform, batch_and_pad
from dataloader.operations.packing import BOSHandling
from dataloader.options import DatasetOptions, ExecutionTrackingMode

__all__ = [
    "BOSHandling",
    "BestFitPackIterDataset",
    "ConcatThenSplitIterDataset",
    "DatasetOptions",
    "ExecutionTrackingMode",
    "FirstFitPackIterDataset",
    "FlatMapTransform",
    "InterleaveIterDataset",
    "MapWithIndexTransform",
    "ParquetIterDataset",
    "ShapeDtypeStruct",
    "TFRecordIterDataset",
    "ThreadPrefetchDatasetIterator",
    "ThreadPrefetchIterDataset",
    "WindowShuffleIterDataset",
    "WindowShuffleMapDataset",
    "WithOptionsIterDataset",
    "apply_transformations",
    "batch_and_pad",
    "device_put",
    "get_element_spec",
    "get_next_index",
    "multithread_prefetch",
    "set_next_index",
]
