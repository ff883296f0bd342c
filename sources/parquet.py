"""Random access to the rows of Parquet files, one decoded row group at a time.

Parquet is a columnar format: the smallest unit that can be decoded is a
column chunk of a row group. So a row is read by decoding its row group (the
selected columns only) once, keeping it in a small LRU cache, and picking the
row out of it. Random access over a large data set therefore decodes about one
row group per record read unless the row groups are small or the access has
locality; write files with small row groups (``row_group_size`` of a few
thousand rows) for random access, or convert them to ArrayRecord.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Mapping, Sequence
from typing import Any, SupportsIndex

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ._indexing import PartIndex, as_index_array, check_index
from ._parquet_rows import DecodedRowGroup
from .files.handles import OPEN_FILES
from .files.metadata_index import FileStat, resolve, stat_local
from .files.paths import PathArg, PerProcessHandles, expand_paths, format_paths
from .remote.urls import is_url, parquet_file, stat_urls


def _read_metadata(path: str, storage_options: Mapping[str, Any] | None = None) -> pq.FileMetaData:
    try:
        return parquet_file(path, storage_options).metadata
    except pa.ArrowInvalid as error:
        if not is_url(path) and os.path.getsize(path) == 0:
            raise ValueError(
                f"Parquet file {path!r} is empty (0 bytes); remove it from paths"
            ) from None
        raise ValueError(f"{path!r} is not a readable Parquet file: {error}") from None


def read_metadata(
    stats: Sequence[FileStat], storage_options: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """What the metadata index keeps of each Parquet file: its columns and the rows of each
    row group, read from its footer here."""
    metas = []
    for stat in stats:
        metadata = _read_metadata(stat.path, storage_options)
        metas.append({
            "columns": metadata.schema.to_arrow_schema().names,
            "row_groups": [metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)],
        })
    return metas


def read_footers(
    paths: Sequence[str], index: Any = None, storage_options: Mapping[str, Any] | None = None
) -> list[tuple[list[str], list[int]]]:
    """The column names and the rows of each row group of each file: from the metadata
    index where it has them (:mod:`.files.metadata_index`), else from the files' footers (read
    concurrently for URLs, by pyarrow's own threads).

    Raises:
        ValueError: a file is empty or not Parquet, or the index has a stale entry for it.
    """
    stats = (stat_urls(list(paths), what="Parquet", example_glob="*.parquet", storage_options=storage_options)
             if paths and all(is_url(p) for p in paths) else [stat_local(p) for p in paths])
    metas = resolve(stats, "parquet", lambda missing: read_metadata(missing, storage_options),
                    index, storage_options)
    return [(list(m["columns"]), [int(n) for n in m["row_groups"]]) for m in metas]


def open_parquet(key: tuple[str, str]) -> pq.ParquetFile:
    """Opens the file of a key of the shared cache, ``("parquet", path)``."""
    return parquet_file(key[1])


def _check_columns(columns: Sequence[str] | None) -> list[str] | None:
    if columns is None:
        return None
    if isinstance(columns, str) or not isinstance(columns, Sequence):
        raise TypeError(
            f"columns must be a list of column names, got {type(columns).__name__} "
            f"{columns!r}; for one column pass [{columns!r}]"
        )
    names = list(columns)
    if not names:
        raise ValueError("columns is empty; pass None for all columns or a list of names")
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"column names must be str, got {type(name).__name__} {name!r}")
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"columns lists {duplicates} more than once; name each column once")
    return names


class ParquetDataSource(PerProcessHandles):
    """Rows of one or more Parquet files as one indexable source.

    Rows are numbered file after file, in the order of ``paths`` (files matched
    by a glob are sorted), and within a file in row order. A row is a dict
    ``column -> value``: numbers and booleans as numpy scalars, strings as
    ``str``, binary as ``bytes``, lists of numbers as 1-D numpy arrays, nulls as
    ``None`` (the full table is in ``sources._parquet_rows``).

    Row counts come from the files' metadata at construction (or from the metadata
    index, which then spares reading every footer); file handles are
    opened lazily in the process that reads, through the process's bounded cache of
    open files, and reopened after unpickling, a fork or an eviction. Reads are thread-safe (one lock guards the handles and the cache, so
    threads of one process decode one row group at a time).

    Args:
        paths: A path, a glob pattern, or a list of those.
        columns: The columns to read, in the order of the row dicts; ``None``
            reads every column of the first file. Every file must have them.
        cache_row_groups: How many decoded row groups to keep (LRU), at least 1.
        index: Where each file's columns and row groups are kept
            (:mod:`~dataloader.sources.files.metadata_index`): None (the index beside the data
            if there is one), True (beside the data, written if need be), a path or URL,
            or False (none: every footer is read here).

    Raises:
        TypeError: ``paths``, ``columns`` or ``cache_row_groups`` has the wrong type.
        ValueError: ``paths`` is empty; a file is empty, has no rows or is not
            Parquet; a column is unknown; ``cache_row_groups`` < 1.
        FileNotFoundError: A path does not exist or a glob matches nothing.

    Example:
        >>> import pyarrow as pa, pyarrow.parquet as pq
        >>> pq.write_table(pa.table({"x": [1, 2, 3]}), "/tmp/x.parquet")
        >>> ParquetDataSource("/tmp/x.parquet")[2]
        {'x': np.int64(3)}
    """

    _TRANSIENT = ("_cache",)

    def __init__(
        self,
        paths: PathArg,
        *,
        columns: Sequence[str] | None = None,
        cache_row_groups: int = 8,
        index: Any = None,
    ) -> None:
        self._paths = tuple(expand_paths(paths, what="Parquet", example_glob="*.parquet"))
        if isinstance(cache_row_groups, bool) or not isinstance(cache_row_groups, int):
            raise TypeError(
                f"cache_row_groups must be an int, got {type(cache_row_groups).__name__} "
                f"{cache_row_groups!r}"
            )
        if cache_row_groups < 1:
            raise ValueError(f"cache_row_groups must be at least 1, got {cache_row_groups}")
        self._cache_row_groups = cache_row_groups
        selected = _check_columns(columns)
        group_rows: list[int] = []
        group_file: list[int] = []
        group_local: list[int] = []
        for file_index, (path, (available, rows)) in enumerate(zip(self._paths, read_footers(self._paths, index))):
            if sum(rows) == 0:
                raise ValueError(f"Parquet file {path!r} has no rows; remove it from paths")
            if selected is None:
                selected = list(available)
            missing = [name for name in selected if name not in available]
            if missing:
                raise ValueError(
                    f"column {missing[0]!r} is not in Parquet file {path!r}; its columns "
                    f"are {available}"
                )
            for group, count in enumerate(rows):
                group_rows.append(count)
                group_file.append(file_index)
                group_local.append(group)
        self._columns = tuple(selected or ())
        self._index = PartIndex(group_rows)
        self._group_file = group_file
        self._group_local = group_local
        self._init_process_state()

    def _reset_handles(self) -> None:
        self._cache: collections.OrderedDict[int, DecodedRowGroup] = collections.OrderedDict()

    def _file_keys(self) -> list[tuple[str, str]]:
        return [("parquet", path) for path in self._paths]

    @property
    def paths(self) -> tuple[str, ...]:
        """The files, in row order."""
        return self._paths

    @property
    def columns(self) -> tuple[str, ...]:
        """The columns of every row, in order."""
        return self._columns

    @property
    def cached_row_groups(self) -> tuple[int, ...]:
        """Global numbers of the cached row groups, least recently used first."""
        return tuple(self._cache)

    def _row_group(self, group: int) -> DecodedRowGroup:
        self._ensure_own_process()
        with self._lock:
            decoded = self._cache.get(group)
            if decoded is not None:
                self._cache.move_to_end(group)
                return decoded
            key = ("parquet", self._paths[self._group_file[group]])
            with OPEN_FILES.hold([key], open_parquet) as (handle,):
                table = handle.read_row_group(self._group_local[group], columns=list(self._columns))
            decoded = DecodedRowGroup(table)
            self._cache[group] = decoded
            while len(self._cache) > self._cache_row_groups:
                self._cache.popitem(last=False)
            return decoded

    def record_location(self, index: SupportsIndex) -> str:
        """Where row ``index`` lives: its file, row group and row in that group."""
        group, row = self._index.locate(check_index(index, self._index.total))
        path = self._paths[self._group_file[group]]
        return f"file {path!r} (row group {self._group_local[group]}, row {row})"

    def __len__(self) -> int:
        return self._index.total

    def __getitem__(self, index: SupportsIndex) -> dict[str, Any]:
        group, row = self._index.locate(check_index(index, self._index.total))
        return self._row_group(group).row(row)

    def __getitems__(self, indices: Sequence[int] | np.ndarray) -> list[dict[str, Any]]:
        """Returns the rows at ``indices`` in the order given.

        Each row group touched is decoded at most once per call, even when the
        call touches more row groups than the cache holds.
        """
        array = as_index_array(indices, self._index.total)
        groups, rows = self._index.locate_many(array)
        group_list = groups.tolist()
        decoded = {group: self._row_group(group) for group in dict.fromkeys(group_list)}
        return [decoded[g].row(r) for g, r in zip(group_list, rows.tolist(), strict=True)]

    def __repr__(self) -> str:
        return (
            f"ParquetDataSource(paths={format_paths(self._paths)}, columns={list(self._columns)}, "
            f"num_records={self._index.total})"
        )
