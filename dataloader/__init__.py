"""granary: a deterministic, checkpointable DataLoader for JAX training loops.

One import gives the whole public API: ``import dataloader as dl`` then
``dl.DataLoader``, ``dl.IndexSampler``, ``dl.ArrayRecordDataSource``,
``dl.MapTransform``, ``dl.Batch``, ...

The import is light: every name loads its module on first use (PEP 562), so
``import dataloader`` costs a few milliseconds, a worker process imports only what its
pipeline needs, and an in-process loader never imports JAX, Orbax, YAML, absl or
pyarrow. ``dir(dl)`` and ``dl.__all__`` list every public name all the same.

Where each name lives (the rooms of the package):

* ``dataloader.samplers``, ``.sources``, ``.operations``: the building blocks (numpy).
* ``dataloader.loader``, ``.iterator``, ``.options``, ``.errors``: the front door.
* ``dataloader.engine``: work units, states, executors and the worker pool.
* ``dataloader.dataset``: ``MapDataset`` / ``IterDataset``, compiled onto the engine.
* ``dataloader.device``: the device feed (JAX); ``dataloader.checkpoint``: Orbax.
* ``dataloader.config``: YAML pipeline configs; ``dataloader.cli``: the command line.
* ``dataloader.maxtext``: MaxText's data keys, batch layout and eval pass (``dl.maxtext``).
* ``dataloader.compat``: ``import grain`` gives granary, for Grain code you cannot edit.
"""

from __future__ import annotations

import importlib
import os as _os  # private: dir(dl) lists only the API
from typing import Any

# Public name -> the module that defines it.
_EXPORTS: dict[str, str] = {
    # front door
    "DataLoader": "dataloader.loader",
    "load": "dataloader.loader",
    "DataLoaderIterator": "dataloader.iterator",
    "elastic_iterator": "dataloader.iterator",
    "MultiprocessingOptions": "dataloader.options",
    "AutoWorkers": "dataloader.options",
    "ReadOptions": "dataloader.options",
    "DatasetOptions": "dataloader.options",
    "ExecutionTrackingMode": "dataloader.options",
    "ElasticStage": "dataloader.engine.restore.protocol",
    "StatePart": "dataloader.engine.restore.protocol",
    "takes_every_host": "dataloader.engine.restore.protocol",
    "EndTogether": "dataloader.engine.stages.finite",
    "PadEnd": "dataloader.engine.stages.finite",
    "RayExecutor": "dataloader.engine.remote.ray_executor",  # imports Ray when used
    "ConfigError": "dataloader.errors",
    "ConvertError": "dataloader.errors",
    "GranaryError": "dataloader.errors",
    "LoaderClosedError": "dataloader.errors",
    "PipelineError": "dataloader.errors",
    "StateMismatchError": "dataloader.errors",
    "WorkerCrashError": "dataloader.errors",
    "WorkerError": "dataloader.errors",
    "WorkerTimeoutError": "dataloader.errors",
    "register_reducer": "dataloader.engine.pool.pickling",  # how an object reaches workers
    # samplers
    "IndexSampler": "dataloader.samplers",
    "NoSharding": "dataloader.samplers",
    "RecordMetadata": "dataloader.samplers",
    "RecordRngFactory": "dataloader.samplers",
    "Sampler": "dataloader.samplers",
    "SequentialSampler": "dataloader.samplers",
    "ShardByJaxProcess": "dataloader.samplers",
    "ShardOptions": "dataloader.samplers",
    "permute": "dataloader.samplers",
    "record_rng": "dataloader.samplers",
    # sources
    "ArrayRecordDataSource": "dataloader.sources",
    "InMemoryDataSource": "dataloader.sources",
    "JsonlDataSource": "dataloader.sources",
    "ParquetDataSource": "dataloader.sources",
    "RandomAccessDataSource": "dataloader.sources",
    "HintedDataSource": "dataloader.sources",
    "RangeDataSource": "dataloader.sources",
    "RemoteOptions": "dataloader.sources",
    "SharedMemoryDataSource": "dataloader.sources",
    "TFRecordReader": "dataloader.sources",
    "expand_paths": "dataloader.sources",
    "max_open_files": "dataloader.sources",
    "read_records": "dataloader.sources",
    "set_max_open_files": "dataloader.sources",
    "write_array_record": "dataloader.sources",
    "write_tfrecord": "dataloader.sources",
    # operations
    "Batch": "dataloader.operations",
    "BatchAndPad": "dataloader.operations",
    "BucketByLength": "dataloader.operations",
    "FilterTransform": "dataloader.operations",
    "FlatMapTransform": "dataloader.operations",
    "MapTransform": "dataloader.operations",
    "MapWithIndexTransform": "dataloader.operations",
    "Operation": "dataloader.operations",
    "RandomMapTransform": "dataloader.operations",
    "batch_and_pad": "dataloader.operations",
    "batch_and_pad_with_mask": "dataloader.operations",
    "stack_elements": "dataloader.operations",
    "BOSHandling": "dataloader.operations",
    "BestFitPack": "dataloader.operations",
    "ConcatThenSplit": "dataloader.operations",
    "FirstFitPack": "dataloader.operations",
    "Tokenize": "dataloader.operations",
    # the dataset API
    "DatasetIterator": "dataloader.dataset",
    "IterDataset": "dataloader.dataset",
    "ThreadPrefetchIterDataset": "dataloader.experimental",
    "WithOptionsIterDataset": "dataloader.experimental",
    "apply_transformations": "dataloader.experimental",
    "get_element_spec": "dataloader.experimental",
    "BestFitPackIterDataset": "dataloader.experimental",
    "ConcatThenSplitIterDataset": "dataloader.experimental",
    "FirstFitPackIterDataset": "dataloader.experimental",
    "multithread_prefetch": "dataloader.experimental",
    "InterleaveIterDataset": "dataloader.experimental",
    "ParquetIterDataset": "dataloader.experimental",
    "TFRecordIterDataset": "dataloader.experimental",
    "WindowShuffleIterDataset": "dataloader.experimental",
    "WindowShuffleMapDataset": "dataloader.experimental",
    "CacheIterDataset": "dataloader.experimental",
    "ElasticIterator": "dataloader.experimental",
    "LimitIterDataset": "dataloader.experimental",
    "PackAndBatchOperation": "dataloader.experimental",
    "RebatchIterDataset": "dataloader.experimental",
    "RepeatIterDataset": "dataloader.experimental",
    "ZipIterDataset": "dataloader.experimental",
    "ZipMapDataset": "dataloader.experimental",
    "assert_equal_output_after_checkpoint": "dataloader.experimental",
    "index_shuffle": "dataloader.experimental",
    "PerformanceConfig": "dataloader.experimental",
    "pick_performance_config": "dataloader.experimental",
    "DatasetSelectionMap": "dataloader.dataset",
    "MapDataset": "dataloader.dataset",
    "MixSchedule": "dataloader.dataset",
    "WeightSchedule": "dataloader.dataset",
    "device_put": "dataloader.dataset",
    "parse_mixture_spec": "dataloader.dataset",
    # device feed (imports JAX)
    "DeviceIterator": "dataloader.device",
    "Placement": "dataloader.device",
    "device_prefetch": "dataloader.device",
    "end_together": "dataloader.device",
    # Orbax (imports Orbax and JAX)
    "CheckpointRestore": "dataloader.checkpoint",
    "CheckpointSave": "dataloader.checkpoint",
    "IteratorCheckpointHandler": "dataloader.checkpoint",
    "PyGrainCheckpointHandler": "dataloader.checkpoint",
    "PyGrainCheckpointRestore": "dataloader.checkpoint",
    "PyGrainCheckpointSave": "dataloader.checkpoint",
    # stats: advice, a flat view for metrics, an absl log line
    "Advice": "dataloader.engine.stats",
    "advise": "dataloader.engine.stats",
    "flatten_stats": "dataloader.engine.stats",
    "log_stats": "dataloader.engine.stats",
    # configs (imports YAML)
    "PipelineConfig": "dataloader.config",
    "load_config": "dataloader.config",
    "parse_config": "dataloader.config",
    "shipped_config": "dataloader.config",
    "shipped_configs": "dataloader.config",
}

# Subpackages reachable as attributes (``dl.samplers``) before anything imported them.
_SUBPACKAGES = (
    "checkpoint", "cli", "compat", "config", "dataset", "device", "engine", "errors", "experimental", "iterator",
    "loader", "maxtext", "operations", "options", "samplers", "sharding", "sources", "testing",
    "transforms",
)

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value  # later lookups skip this function
        return value
    if name in _SUBPACKAGES:
        return importlib.import_module(f"dataloader.{name}")
    raise AttributeError(f"module 'dataloader' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, *_SUBPACKAGES})


# GRANARY_GRAIN_ALIAS=1 makes `import grain` give granary here and in every worker and
# fork server (they inherit the variable and import dataloader first). It only puts a
# finder on sys.meta_path: nothing heavy is imported.
if _os.environ.get("GRANARY_GRAIN_ALIAS"):
    from dataloader.compat import install_from_environment

    install_from_environment()
