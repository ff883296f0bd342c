"""granary: a deterministic, checkpointable DataLoader for JAX training loops.

One import gives the whole public API: ``import dataloader as dl`` then
``dl.DataLoader``, ``dl.IndexSampler``, ``dl.ArrayRecordDataSource``,
``dl.MapTransform``, ``dl.Batch``, ...
"""

from dataloader.dataset import IterDataset, MapDataset, MultiprocessingOptions, device_put
from dataloader.errors import (
    ConfigError,
    GranaryError,
    PipelineError,
    StateMismatchError,
    WorkerCrashError,
    WorkerError,
)
from dataloader.iterator import DataLoaderIterator
from dataloader.loader import DataLoader
from dataloader.options import ReadOptions
from operations import (
    Batch,
    BatchAndPad,
    FilterTransform,
    FlatMapTransform,
    MapTransform,
    Operation,
    RandomMapTransform,
    batch_and_pad,
    stack_elements,
)
from samplers import (
    IndexSampler,
    NoSharding,
    RecordMetadata,
    SequentialSampler,
    ShardByJaxProcess,
    ShardOptions,
    permute,
    record_rng,
)
from sources import (
    ArrayRecordDataSource,
    InMemoryDataSource,
    RandomAccessDataSource,
    RangeDataSource,
    read_records,
    write_array_record,
)

# Names whose modules are heavy to import (pyarrow, JAX) load on first use, so worker
# processes that do not need them never pay for them.
_LAZY = {
    "CheckpointRestore": "dataloader.checkpoint",
    "CheckpointSave": "dataloader.checkpoint",
    "DeviceIterator": "dataloader.device",
    "IteratorCheckpointHandler": "dataloader.checkpoint",
    "ParquetDataSource": "sources",
    "PipelineConfig": "dataloader.config",
    "device_prefetch": "dataloader.device",
    "load_config": "dataloader.config",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'dataloader' has no attribute {name!r}")


__all__ = [
    "ArrayRecordDataSource",
    "Batch",
    "BatchAndPad",
    "CheckpointRestore",
    "CheckpointSave",
    "ConfigError",
    "DataLoader",
    "DataLoaderIterator",
    "DeviceIterator",
    "FilterTransform",
    "FlatMapTransform",
    "GranaryError",
    "InMemoryDataSource",
    "IndexSampler",
    "IterDataset",
    "IteratorCheckpointHandler",
    "MapDataset",
    "MapTransform",
    "MultiprocessingOptions",
    "NoSharding",
    "Operation",
    "ParquetDataSource",
    "PipelineConfig",
    "PipelineError",
    "RandomAccessDataSource",
    "RandomMapTransform",
    "RangeDataSource",
    "ReadOptions",
    "RecordMetadata",
    "SequentialSampler",
    "ShardByJaxProcess",
    "ShardOptions",
    "StateMismatchError",
    "WorkerCrashError",
    "WorkerError",
    "batch_and_pad",
    "device_prefetch",
    "device_put",
    "load_config",
    "permute",
    "read_records",
    "record_rng",
    "stack_elements",
    "write_array_record",
]
