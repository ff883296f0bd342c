"""Where MaxText's records come from: random access for ArrayRecord and Parquet, file
streams for TFRecord, as MaxText's ``get_datasets`` reads them.

* **ArrayRecord, Parquet** (:func:`indexed_records`): one source over the pattern's
  files, globally shuffled with ``data_shuffle_seed`` (each epoch its own order),
  repeated ``num_epoch`` times. The stream is sharded over hosts after the shuffle
  (``to_iter_dataset(shard_options=...)``) and its reads run in the worker processes.
  ``grain_index_storage_option`` reaches the ArrayRecord reader.
* **TFRecord** (:func:`file_stream`): files have no index, so they are read in order,
  as MaxText does: the file list shuffled per epoch and repeated, this host's files
  (``files[h::H]``; with fewer files than hosts, each file read by several hosts that
  keep every ``k``-th record), ``min(files, grain_num_threads)`` files interleaved, the
  records window-shuffled over ``grain_shuffle_buffer_size``. The state is the files'
  offsets and the window's, a few numbers. A stream runs in the training process (a
  prefetch thread), not in worker processes.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent import futures
from typing import Any

from dataloader.dataset.base import IterDataset
from dataloader.dataset.map_dataset import MapDataset
from dataloader.maxtext.config import MaxTextConfig
from dataloader.operations import FilterTransform, MapWithIndexTransform
from dataloader.samplers import ShardOptions


def _source(config: MaxTextConfig, pattern: str) -> Any:
    from dataloader.sources import ArrayRecordDataSource, ParquetDataSource

    if config.file_type == "parquet":
        return ParquetDataSource(pattern)
    if config.index_storage_option is None:
        return ArrayRecordDataSource(pattern)
    return ArrayRecordDataSource(pattern, reader_options={"index_storage_option": config.index_storage_option})


def open_sources(config: MaxTextConfig, patterns: Sequence[str]) -> list[Any]:
    """One source per pattern, opened by ``grain_data_source_max_workers`` threads (globbing
    and reading file indexes wait on storage, as in MaxText)."""
    if len(patterns) == 1:
        return [_source(config, patterns[0])]
    with futures.ThreadPoolExecutor(max_workers=config.data_source_max_workers) as pool:
        return list(pool.map(lambda p: _source(config, p), patterns))


def indexed_records(config: MaxTextConfig, source: Any, *, shuffle: bool, num_epochs: int | None,
                    seed: int) -> MapDataset:
    """``source``'s records, shuffled with ``seed`` (each epoch its own order) and repeated."""
    ds = MapDataset.source(source)
    if shuffle:
        ds = ds.shuffle(seed=seed)
    if num_epochs != 1:
        ds = ds.repeat(num_epochs)
    return ds


def file_sharding(file_count: int, host: int, hosts: int) -> tuple[slice, int, tuple[int, int] | None]:
    """(this host's files, files per host, (row shard, row shards) or None), as MaxText's
    ``compute_file_sharding``: with at least as many files as hosts, host ``h`` reads
    ``files[h::H]``; with fewer, file ``h % F`` is read by every host of its group, each
    keeping one record in ``k``.

    Example:
        >>> file_sharding(2, 3, 4)
        (slice(1, None, 2), 1, (1, 2))
    """
    if file_count >= hosts:
        return slice(host, None, hosts), max(file_count // hosts, 1), None
    file = host % file_count
    readers = hosts // file_count + (1 if file < hosts % file_count else 0)
    return slice(file, None, file_count), 1, ((host // file_count, readers) if readers > 1 else None)


class _Numbered(MapWithIndexTransform):
    def map_with_index(self, index: int, element: Any) -> tuple[int, Any]:
        return index, element


class _OneIn(FilterTransform):
    """Keeps the numbered records ``i`` with ``i % count == index``."""

    def __init__(self, index: int, count: int) -> None:
        super().__init__()
        self.index, self.count = index, count

    def filter(self, element: tuple[int, Any]) -> bool:
        return element[0] % self.count == self.index


def _record(element: tuple[int, Any]) -> Any:
    return element[1]


def file_stream(config: MaxTextConfig, pattern: str, *, shuffle: bool, num_epochs: int | None,
                shard_options: ShardOptions, num_threads: int) -> IterDataset:
    """The records of TFRecord files matching ``pattern``, read in order (module docstring).

    Raises:
        FileNotFoundError: the pattern matches no file.
    """
    from dataloader.dataset.streams import TFRecordIterDataset
    from dataloader.dataset.transformations.interleave import InterleaveIterDataset
    from dataloader.dataset.transformations.window_shuffle import WindowShuffleIterDataset
    from dataloader.sources import expand_paths

    paths = expand_paths(pattern, what="TFRecord", example_glob="*.tfrecord")
    take, per_host, rows = file_sharding(len(paths), shard_options.shard_index, shard_options.shard_count)
    files = MapDataset.source(paths)
    if shuffle:
        files = files.shuffle(seed=config.seed)
    if num_epochs != 1:
        files = files.repeat(num_epochs)
    files = files.slice(take)
    records: IterDataset = InterleaveIterDataset(files.map(TFRecordIterDataset),
                                                 cycle_length=max(1, min(per_host, num_threads)))
    if rows is not None:
        records = records.map_with_index(_Numbered()).filter(_OneIn(*rows)).map(_record)
    if shuffle:
        records = WindowShuffleIterDataset(records, window_size=config.shuffle_buffer_size, seed=config.seed)
    return records
