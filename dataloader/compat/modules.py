"""Which Grain module path gives which granary names: the alias's table, data only.

Each entry is one module of Grain (``grain.python``, ``grain._src.python.dataset.dataset``,
...) and says where its names live in granary. A name resolves, on first use, to the
first of:

1. the ``renamed`` candidates for that name (``"module:attribute"``), where Grain and
   granary spell a name differently (``PyGrainDatasetIterator`` is
   ``DataLoaderIterator``);
2. the attribute of the same spelling in each ``search`` module, in order.

A candidate module that granary does not have (yet) is skipped, and so is an attribute
it lacks, so a name another room adds later (``dataloader.experimental.pick_performance_config``)
appears through the alias as soon as it exists, with no change here. ``names`` lists
Grain's own names of the module: what ``dir()`` and ``__all__`` show and how an error
tells "Grain has it, granary does not" from a misspelling.

Grain's names are read from Grain's public modules (``grain/__init__.py``,
``grain/python/__init__.py``, ``grain/experimental.py``, ...); the ``grain._src`` paths
are those that MaxText and torchtitan import, and the modules their names come from.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping


@dataclasses.dataclass(frozen=True)
class GrainModule:
    """Where the names of one Grain module live in granary.

    Args:
        names: Grain's names in the module (not its submodules: those are the table's
            other keys).
        search: granary modules whose attribute of the same name is the Grain name.
        renamed: Grain name -> ``"granary.module:attribute"`` candidates tried first.
    """

    names: tuple[str, ...]
    search: tuple[str, ...] = ()
    renamed: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)


_CONSTANTS = ("DATASET_INDEX", "EPOCH", "INDEX", "META_FEATURES", "RECORD", "RECORD_KEY", "SEED")
_SHARDING = ("NoSharding", "ShardByJaxProcess", "ShardOptions")
_SAMPLERS = ("IndexSampler", "Sampler", "SequentialSampler")
_TRANSFORMS = ("Batch", "Filter", "Map", "MapWithIndex", "RandomMap", "TfRandomMap",
               "Transformation", "Transformations")
_CHECKPOINT = "dataloader.checkpoint"

_EXPERIMENTAL = GrainModule(
    names=(
        "BOSHandling", "BestFitPackIterDataset", "CacheIterDataset", "ConcatThenSplitIterDataset",
        "DatasetOptions", "ElasticIterator", "ExecutionTrackingMode", "FirstFitPackIterDataset",
        "FlatMapIterDataset", "FlatMapMapDataset", "FlatMapTransform", "InterleaveIterDataset",
        "LimitIterDataset", "MapWithIndexTransform", "PackAndBatchOperation", "ParquetIterDataset",
        "PerformanceConfig", "RebatchIterDataset", "RepeatIterDataset", "RngPool", "ShapeDtypeStruct",
        "ShapeDtypeStructProtocol", "TFRecordIterDataset", "ThreadPrefetchDatasetIterator",
        "ThreadPrefetchIterDataset", "WindowShuffleIterDataset", "WindowShuffleMapDataset",
        "WithOptionsIterDataset", "ZipIterDataset", "ZipMapDataset", "apply_transformations",
        "assert_equal_output_after_checkpoint", "batch_and_pad", "device_put", "get_element_spec",
        "get_next_index", "index_shuffle", "multithread_prefetch", "pick_performance_config",
        "set_next_index",
    ),
    search=("dataloader.experimental", "dataloader"),
)

MODULES: dict[str, GrainModule] = {
    "grain": GrainModule(
        names=("DataLoader", "DataLoaderIterator", "DatasetIterator", "IterDataset", "MapDataset",
               "MultiprocessingOptions", "ReadOptions", "Record", "RecordMetadata", "config", "load",
               "monitoring"),
        search=("dataloader",),
    ),
    "grain.python": GrainModule(
        names=(*_CONSTANTS, *_SHARDING, *_SAMPLERS,
               "ArrayRecordDataSource", "Batch", "BatchOperation", "DataLoader", "DatasetIterator",
               "DatasetSelectionMap", "FilterOperation", "FilterTransform", "InMemoryDataSource",
               "IterDataset", "MapDataset", "MapOperation", "MapTransform", "MapWithIndexTransform",
               "MultiprocessingOptions", "Operation", "PyGrainCheckpointHandler",
               "PyGrainCheckpointRestore", "PyGrainCheckpointSave", "PyGrainDatasetIterator",
               "RandomAccessDataSource", "RandomMapOperation", "RandomMapTransform", "RangeDataSource",
               "ReadOptions", "Record", "RecordMetadata", "SharedMemoryArray", "Transformation",
               "Transformations", "config", "load"),
        search=("dataloader", "dataloader.transforms"),
        renamed={
            # Grain's checkpoint handler under its grain.python names; granary's own
            # names are the fallback until dataloader.checkpoint spells them as Grain does.
            "PyGrainCheckpointHandler": (f"{_CHECKPOINT}:PyGrainCheckpointHandler",
                                         f"{_CHECKPOINT}:IteratorCheckpointHandler"),
            "PyGrainCheckpointSave": (f"{_CHECKPOINT}:PyGrainCheckpointSave", f"{_CHECKPOINT}:CheckpointSave"),
            "PyGrainCheckpointRestore": (f"{_CHECKPOINT}:PyGrainCheckpointRestore",
                                         f"{_CHECKPOINT}:CheckpointRestore"),
            "PyGrainDatasetIterator": ("dataloader:DataLoaderIterator",),
        },
    ),
    "grain.python.experimental": _EXPERIMENTAL,
    "grain.experimental": _EXPERIMENTAL,
    "grain.checkpoint": GrainModule(
        names=("CheckpointHandler", "CheckpointRestore", "CheckpointSave"),
        search=(_CHECKPOINT,),
        renamed={"CheckpointHandler": (f"{_CHECKPOINT}:CheckpointHandler",
                                       f"{_CHECKPOINT}:IteratorCheckpointHandler")},
    ),
    "grain.constants": GrainModule(names=_CONSTANTS),
    "grain.multiprocessing": GrainModule(
        names=("MultiprocessingOptions", "SharedMemoryArray", "SharedMemoryArrayMetadata"),
        search=("dataloader",),
    ),
    "grain.samplers": GrainModule(names=_SAMPLERS, search=("dataloader.samplers",)),
    "grain.sharding": GrainModule(names=_SHARDING, search=("dataloader.sharding",)),
    "grain.sources": GrainModule(
        names=("ArrayRecordDataSource", "RandomAccessDataSource", "RangeDataSource",
               "SharedMemoryDataSource"),
        search=("dataloader.sources",),
    ),
    "grain.transforms": GrainModule(
        names=(*_TRANSFORMS, "DatasetSelectionMap"), search=("dataloader.transforms", "dataloader"),
    ),
    # grain._src: the private paths real code imports (MaxText, torchtitan), and the
    # modules that define the names above. The packages in between hold no names.
    "grain._src": GrainModule(names=()),
    "grain._src.core": GrainModule(names=()),
    "grain._src.core.constants": GrainModule(names=_CONSTANTS),
    "grain._src.core.sharding": GrainModule(names=_SHARDING, search=("dataloader.sharding",)),
    "grain._src.core.transforms": GrainModule(names=(*_TRANSFORMS, "FlatMap"), search=("dataloader.transforms",)),
    "grain._src.python": GrainModule(names=()),
    "grain._src.python.data_loader": GrainModule(
        names=("DataLoader", "DataLoaderIterator"), search=("dataloader",),
    ),
    "grain._src.python.data_sources": GrainModule(
        names=("ArrayRecordDataSource", "RangeDataSource", "SharedMemoryDataSource"),
        search=("dataloader.sources",),
    ),
    "grain._src.python.options": GrainModule(
        names=("MultiprocessingOptions", "ReadOptions"), search=("dataloader",),
    ),
    "grain._src.python.record": GrainModule(names=("Record", "RecordMetadata"), search=("dataloader",)),
    "grain._src.python.samplers": GrainModule(names=_SAMPLERS, search=("dataloader.samplers",)),
    "grain._src.python.dataset": GrainModule(names=()),
    "grain._src.python.dataset.base": GrainModule(
        names=("DatasetOptions", "DatasetSelectionMap", "ExecutionTrackingMode", "RandomAccessDataSource",
               "ShapeDtypeStruct"),
        search=("dataloader.experimental", "dataloader"),
    ),
    "grain._src.python.dataset.dataset": GrainModule(
        names=("DatasetIterator", "IterDataset", "MapDataset", "WithOptionsIterDataset",
               "apply_transformations", "get_element_spec", "get_next_index", "set_next_index"),
        search=("dataloader.dataset", "dataloader.experimental"),
    ),
    "grain._src.python.dataset.sources": GrainModule(names=()),
    "grain._src.python.dataset.sources.parquet_dataset": GrainModule(
        names=("ParquetIterDataset",), search=("dataloader.experimental",),
    ),
    "grain._src.python.dataset.sources.tfrecord_dataset": GrainModule(
        names=("TFRecordIterDataset", "_TFRecordDatasetIterator", "_TFRecordReader"),
        search=("dataloader.compat.tfrecord", "dataloader.experimental"),
    ),
    # What Grain's elastic iterator and its tests import.
    "grain._src.python.dataset.elastic_iterator": GrainModule(
        names=("ElasticIterator",), search=("dataloader.experimental",),
    ),
    "grain._src.python.dataset.transformations": GrainModule(names=()),
    "grain._src.python.dataset.transformations.interleave": GrainModule(
        names=("InterleaveDatasetIterator", "InterleaveIterDataset"),
        search=("dataloader.dataset.transformations.interleave",),
    ),
    "grain._src.python.testing": GrainModule(names=()),
    "grain._src.python.testing.experimental": GrainModule(
        names=("assert_equal_output_after_checkpoint",), search=("dataloader.testing",),
    ),
    "grain._src.python.checkpoint": GrainModule(names=()),
    "grain._src.python.checkpoint.handler": GrainModule(
        names=("CheckpointHandler",), search=(_CHECKPOINT,),
        renamed={"CheckpointHandler": (f"{_CHECKPOINT}:CheckpointHandler", f"{_CHECKPOINT}:IteratorCheckpointHandler")},
    ),
}


# Grain names granary deliberately does not provide: name -> (why, what to use instead).
# The alias's refusal says both; the docs' Grain page lists them ("Differences from Grain").
_LEGACY = (
    "Grain's older operation API (a function over an iterator of Record(metadata, data), "
    "which Grain itself replaced with transforms): such a function sees the whole stream "
    "of one worker, so its output would depend on the worker count"
)
_LEGACY_INSTEAD = ("MapTransform, FilterTransform, Batch or RandomMapTransform (Grain's "
                   "grain.transforms.Map, Filter, Batch, RandomMap), which run on any worker, in order")
_RECORD_KEYS = ("a key of Grain's Record-based operations, which granary does not have",
                "the element itself in a transform; RecordMetadata from a sampler's __getitem__")
DIFFERENCES: dict[str, tuple[str, str]] = {
    **dict.fromkeys(("Record", "MapOperation", "FilterOperation", "BatchOperation", "RandomMapOperation"),
                    (_LEGACY, _LEGACY_INSTEAD)),
    **dict.fromkeys(_CONSTANTS, _RECORD_KEYS),
    "TfRandomMap": ("it hands a transform TensorFlow random ops and a TF seed; granary's "
                    "pipelines are numpy and never import TensorFlow",
                    "RandomMapTransform (grain.transforms.RandomMap), whose random_map(element, rng) "
                    "gets a numpy Generator seeded per record"),
    "config": ("Grain's absl-flags configuration object (debug modes, visualization, "
               "thresholds) has no counterpart: granary reads no global flags",
               "the options objects (ReadOptions, MultiprocessingOptions, DatasetOptions) and "
               "stats() on every iterator"),
    "monitoring": ("Grain's metric counters report to Google's monitoring", "stats() on every "
                   "iterator, dl.flatten_stats for metrics, dl.log_stats for a log line"),
    **dict.fromkeys(("SharedMemoryArray", "SharedMemoryArrayMetadata"),
                    ("Grain's numpy subclass that a transform returns to send a batch through "
                     "shared memory; every result of a granary worker travels through shared "
                     "memory already", "nothing: return plain numpy arrays")),
    "RngPool": ("a Grain internal (a cache of generators for random maps)",
                "dl.record_rng(seed, position) for a record's generator"),
    "ShapeDtypeStructProtocol": ("the typing protocol of Grain's element specs",
                                 "dl.experimental.ShapeDtypeStruct, as get_element_spec(ds) returns it"),
}


def submodules(name: str) -> list[str]:
    """The table's modules directly under ``name`` (``grain`` -> ``python``, ...)."""
    prefix = name + "."
    return sorted(key[len(prefix):] for key in MODULES if key.startswith(prefix) and "." not in key[len(prefix):])
