"""Streaming sources: files read in order, as ``IterDataset`` (Grain's experimental names).

``ParquetIterDataset`` and ``TFRecordIterDataset`` read their files front to back
(Parquet a row group at a time, TFRecord a record at a time); their state is a
position in a file, so a restore seeks there. They are iterator-level datasets: they
run in the consumer's process (under ``mp_prefetch``, in its thread), so their output
and states never depend on the number of workers. Shuffle them as MaxText does: the
file list with ``MapDataset.source(paths).shuffle()``, the files interleaved with
``InterleaveIterDataset``, the rows with ``WindowShuffleIterDataset``.
"""

from dataloader.dataset.streams.parquet import ParquetIterDataset
from dataloader.dataset.streams.tfrecord import TFRecordIterDataset

__all__ = ["ParquetIterDataset", "TFRecordIterDataset"]
