"""Streaming sources: files read in order, as ``IterDataset`` (Grain's experimental names).

``ParquetIterDataset`` and ``TFRecordIterDataset`` read their files front to back
(Parquet a row group at a time, TFRecord a record at a time); their state is a
position in a file, so a restore seeks there. Iterated alone they run in the
consumer's process (under ``mp_prefetch``, in its thread). The element-wise calls
chained on a ``ParquetIterDataset`` or on a ``TFRecordIterDataset`` of local
uncompressed files (``map``, ``filter``, ``flat_map``, ``random_map``, ``batch``,
``mp_prefetch``), or on a finite list of them interleaved and window-shuffled, run on
the engine instead, in worker processes: a record is found by its position in the
stream (Parquet from the files' row-group metadata, TFRecord from an index of record
offsets read from the record headers; :mod:`~dataloader.dataset.streams.lowering` says
which streams and how), so a worker reads a run of consecutive records itself. Either
way the output and the states never depend on the number of workers. Gzip-compressed
TFRecord files, which can only be read from their start, stay in the consumer with
what follows them. Shuffle them as MaxText does: the
file list with ``MapDataset.source(paths).shuffle()``, the files interleaved with
``InterleaveIterDataset``, the rows with ``WindowShuffleIterDataset``.
"""

from dataloader.dataset.streams.parquet import ParquetIterDataset
from dataloader.dataset.streams.tfrecord import TFRecordIterDataset

__all__ = ["ParquetIterDataset", "TFRecordIterDataset"]
