"""Data sources: random access to records by index.

A data source is anything with ``__len__`` and ``__getitem__`` (see
:class:`RandomAccessDataSource` for the obligations); this package provides
sources over ranges, in-memory sequences, ArrayRecord, Parquet and JSON Lines files,
the sequential TFRecord reader and writer (:mod:`.tfrecord`), :func:`read_records`, the one function through which the loader reads, and
:func:`expand_paths`, which turns paths and globs into files the way the
file-backed sources do (for tools that check paths before building a source), and
:func:`set_max_open_files`, the bound on the files a process keeps open across all its
sources (:mod:`.files.handles`).

It depends on numpy, array_record and pyarrow only, and knows nothing of
samplers, operations or workers. ``ParquetDataSource`` is imported on first
use, so a worker process that unpickles an ArrayRecord or in-memory source
does not pay for importing pyarrow (about 0.1 s and tens of MB per process).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .array_record import ArrayRecordDataSource
from .array_record_writer import write_array_record
from .base import HintedDataSource, RandomAccessDataSource, read_records
from .files.handles import max_open_files, set_max_open_files
from .files.paths import expand_paths
from .in_memory import InMemoryDataSource, RangeDataSource
from .jsonl import JsonlDataSource
from .remote import RemoteOptions
from .shared_memory import SharedMemoryDataSource
from .tfrecord import TFRecordReader, write_tfrecord

if TYPE_CHECKING:
    from .parquet import ParquetDataSource

__all__ = [
    "ArrayRecordDataSource",
    "HintedDataSource",
    "InMemoryDataSource",
    "JsonlDataSource",
    "ParquetDataSource",
    "RandomAccessDataSource",
    "RangeDataSource",
    "RemoteOptions",
    "SharedMemoryDataSource",
    "TFRecordReader",
    "expand_paths",
    "max_open_files",
    "read_records",
    "set_max_open_files",
    "write_array_record",
    "write_tfrecord",
]


def __getattr__(name: str) -> Any:
    if name == "ParquetDataSource":
        from .parquet import ParquetDataSource

        return ParquetDataSource
    raise AttributeError(f"module 'sources' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})

if __name__ != "dataloader.sources":  # pragma: no cover - a wrong sys.path, not a user error
    raise ImportError(
        f"this folder is installed as dataloader.sources, but it was imported as {__name__!r}; "
        f"import dataloader.sources (install the project with pip install -e . to develop it)"
    )
