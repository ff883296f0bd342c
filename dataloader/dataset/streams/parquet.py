"""Grain's ``ParquetIterDataset``: the rows of Parquet files, read in order.

Parquet is columnar: the smallest unit it decodes is a row group. Read in order, each
row group is decoded once (by pyarrow, with its own threads, while the rows of the one
before are handed out) and all its rows are handed out; ``ParquetDataSource``'s random access instead decodes a row group for
nearly every row it reads once the data is larger than its cache, which is why
streaming is tens of times faster (``benchmarks/streaming.py`` measures both).

Rows are the dicts ``ParquetDataSource`` returns (numbers as numpy scalars, strings
as ``str``, lists of numbers as numpy arrays, nulls as ``None``), so a pipeline can
move between the two. The state of one file is ``{"path", "row_group",
"index_within_row_group"}`` (Grain's fields, plus the file's base name): a restore
decodes that one row group.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent import futures
from typing import TYPE_CHECKING, Any

from dataloader.dataset.base import DatasetIterator
from dataloader.dataset.streams.files import CYCLE_LENGTH, FileIterDataset, check_file_state
from dataloader.dataset.streams.parquet_source import ParquetStreamSource

if TYPE_CHECKING:
    from dataloader.dataset.streams.lowering import StreamForm

# Rows built at once from a decoded row group: dicts in bulk are ~2x faster than one at a
# time, and a chunk, not the whole group, bounds the memory they take.
_CHUNK_ROWS = 1024


def _open(path: str, read_kwargs: dict[str, Any]) -> Any:
    import pyarrow as pa

    from dataloader.sources.remote.urls import parquet_file  # a path or a URL

    try:
        return parquet_file(path, **read_kwargs)
    except (pa.ArrowInvalid, OSError) as error:
        if isinstance(error, FileNotFoundError):
            raise
        raise ValueError(f"{path!r} is not a readable Parquet file: {error}") from None


# Footers read in this process: (path, size, mtime) -> (column names, rows per row group).
# MaxText's file list makes one ParquetIterDataset per file and epoch; a file is opened
# (or looked up in the metadata index) once for all of them, and again if it changes.
_FOOTERS: dict[tuple[str, int, int], tuple[list[str], tuple[int, ...]]] = {}
_FOOTERS_KEPT = 65536


def _footers(paths: list[str], read_kwargs: dict[str, Any], index: Any) -> list[tuple[list[str], tuple[int, ...]]]:
    """The column names and the rows of each row group of each file: through the metadata
    index (``index``, see ``dl.ParquetDataSource``; the files not seen yet looked up at
    once) unless ``read_kwargs`` opens them its own way."""
    if read_kwargs:  # a file system of its own, memory mapping...: read as asked, not cached
        found = []
        for path in paths:
            handle = _open(path, read_kwargs)
            try:
                meta = handle.metadata
                found.append((list(handle.schema_arrow.names),
                              tuple(meta.row_group(g).num_rows for g in range(meta.num_row_groups))))
            finally:
                handle.close()
        return found
    from dataloader.sources.parquet import read_footers

    keys: list[tuple[str, int, int] | None] = []
    for path in paths:  # local files only: no cheap stat elsewhere
        info = None if "://" in path else os.stat(path)
        keys.append(None if info is None else (path, info.st_size, info.st_mtime_ns))
    todo = [i for i, key in enumerate(keys) if key is None or key not in _FOOTERS]
    read = dict(zip(todo, read_footers([paths[i] for i in todo], index))) if todo else {}
    if len(_FOOTERS) + len(todo) > _FOOTERS_KEPT:
        _FOOTERS.clear()
    out = []
    for i, key in enumerate(keys):
        if i in read:
            names, rows = read[i]
            if key is not None:
                _FOOTERS[key] = (names, tuple(rows))
            out.append((names, tuple(rows)))
        else:
            out.append(_FOOTERS[key])  # type: ignore[index]
    return out


class ParquetIterDataset(FileIterDataset):
    """The rows of one or more Parquet files, in order, as dicts ``column -> value``.

    Args:
        path: a path, a glob pattern (files sorted), or a list of those. Several files
            are interleaved, 16 at a time, one row from each in turn (as in Grain); for
            a file order shuffled per epoch, see :mod:`dataloader.dataset.streams`.
        columns: the columns to read (``None``: all). Not in Grain.
        index: where the files' footers (columns, row groups) are kept, as for
            ``dl.ParquetDataSource`` (None: the index beside the data, if any). Not in Grain.
        **read_kwargs: passed to ``pyarrow.parquet.ParquetFile`` (``memory_map``,
            ``buffer_size``, ``filesystem``, ...), as in Grain. With ``filesystem``
            the paths are taken as they are, not globbed.

    Raises:
        FileNotFoundError: a path does not exist or a glob matches nothing.
        ValueError: a file is not Parquet, or lacks one of ``columns``.
        TypeError: ``columns`` is not a list of names, or ``read_kwargs`` has a
            keyword ``ParquetFile`` does not take.

    Example:
        >>> import pyarrow as pa, pyarrow.parquet as pq, dataloader as dl
        >>> pq.write_table(pa.table({"id": [1, 2], "val": ["A", "B"]}), "/tmp/iv.parquet")
        >>> list(dl.experimental.ParquetIterDataset("/tmp/iv.parquet"))
        [{'id': np.int64(1), 'val': 'A'}, {'id': np.int64(2), 'val': 'B'}]
    """

    def __init__(
        self, path: Any, *, columns: Sequence[str] | None = None, index: Any = None, **read_kwargs: Any
    ) -> None:
        super().__init__(path, what="Parquet", example_glob="*.parquet",
                         local=read_kwargs.get("filesystem") is None)
        if columns is not None and (isinstance(columns, str) or not all(isinstance(c, str) for c in columns)):
            raise TypeError(f"columns must be a list of column names, got {columns!r}")
        self.columns = None if columns is None else list(columns)
        self.read_kwargs = read_kwargs
        # The rows of each row group of each file, from the footers read here: what maps
        # a stream position to its file and row on the engine (no worker reads a footer
        # to find its rows).
        self._group_rows: dict[str, tuple[int, ...]] = {}
        # Read here (failing here, not in the middle of an epoch), all at once.
        for file, (names, rows) in zip(self._paths, _footers(self._paths, read_kwargs, index)):
            self._group_rows[file] = rows
            missing = [c for c in self.columns or () if c not in names]
            if missing:
                raise ValueError(f"column {missing[0]!r} is not in Parquet file {file!r}; its columns are {names}")

    def _file_iterator(self, path: str) -> DatasetIterator:
        return ParquetFileIterator(path, self.columns, self.read_kwargs)

    def _stream_form(self) -> StreamForm | None:
        """This stream as random access over its order: a source computed by position
        (None for a subclass that reads its files its own way)."""
        from dataloader.dataset.map_dataset import MapDataset
        from dataloader.dataset.streams.lowering import StreamForm

        cls = type(self)
        if cls.__iter__ is not FileIterDataset.__iter__ or cls._file_iterator is not ParquetIterDataset._file_iterator:
            return None

        source = ParquetStreamSource(self._paths, [self._group_rows[p] for p in self._paths],
                                     self.columns, self.read_kwargs, CYCLE_LENGTH)
        return StreamForm(MapDataset.source(source), source.position_of_state)


class ParquetFileIterator(DatasetIterator):
    """The rows of one Parquet file, a decoded row group at a time.

    While the rows of one row group are handed out, a thread of this iterator reads
    the next row group (pyarrow releases the GIL while it reads and decodes), so the
    consumer rarely waits for a read. ``start_prefetch()`` starts reading the first.
    """

    stats_name = "read"  # stats(): reading the file is the stream's read stage

    def __init__(self, path: str, columns: list[str] | None, read_kwargs: dict[str, Any]) -> None:
        super().__init__()
        self._path = path
        self._name = os.path.basename(path)
        self._columns = columns
        self._file = _open(path, read_kwargs)
        self._groups = self._file.num_row_groups
        self._group = 0
        self._row = 0
        self._decoded: Any = None  # the current row group, once decoded
        self._rows: list[dict[str, Any]] = []  # the next rows of it, built a chunk at a time
        self._pool: futures.ThreadPoolExecutor | None = None
        self._ahead: tuple[int, futures.Future[Any]] | None = None  # a row group being read

    def _read(self, group: int) -> Any:
        return self._file.read_row_group(group, columns=self._columns)

    def _read_ahead(self, group: int) -> None:
        if group >= self._groups or (self._ahead is not None and self._ahead[0] == group):
            return
        self._drop_ahead()
        if self._pool is None:
            self._pool = futures.ThreadPoolExecutor(1, thread_name_prefix="granary-parquet")
        self._ahead = (group, self._pool.submit(self._read, group))

    def _drop_ahead(self) -> None:
        """Forgets the row group read ahead (waiting for the read: one reader at a time)."""
        if self._ahead is not None:
            _, pending = self._ahead
            self._ahead = None
            pending.cancel() or pending.exception()

    def _decode(self) -> None:
        from dataloader.sources._parquet_rows import DecodedRowGroup

        group = self._group
        try:
            if self._ahead is not None and self._ahead[0] == group:
                table = self._ahead[1].result()
                self._ahead = None
            else:
                self._drop_ahead()
                table = self._read(group)
        except Exception as error:
            raise ValueError(f"Parquet file {self._path!r}: row group {group} cannot be read: {error}") from error
        self._read_ahead(group + 1)
        self._decoded = DecodedRowGroup(table)

    def start_prefetch(self) -> None:
        if not self._closed and self._decoded is None:
            self._read_ahead(self._group)

    def __next__(self) -> dict[str, Any]:
        if self._closed:
            raise ValueError(f"next() on a closed iterator ({self!r}); make a new one")
        if not self._rows:
            while True:
                if self._group >= self._groups:
                    raise StopIteration
                if self._decoded is None:
                    self._decode()
                if self._row < self._decoded.num_rows:
                    break
                self._group, self._row, self._decoded = self._group + 1, 0, None
            stop = min(self._row + _CHUNK_ROWS, self._decoded.num_rows)
            self._rows = self._decoded.rows(self._row, stop)
            self._rows.reverse()  # handed out from the end: pop() is O(1)
        self._row += 1
        return self._rows.pop()

    def get_state(self) -> dict[str, Any]:
        return {"path": self._name, "row_group": self._group, "index_within_row_group": self._row}

    def set_state(self, state: dict[str, Any]) -> None:
        state = check_file_state(state, self._path, ("row_group", "index_within_row_group"), "a Parquet file")
        group, row = int(state["row_group"]), int(state["index_within_row_group"])
        if not 0 <= group <= self._groups or row < 0:
            raise ValueError(
                f"row group {group} is outside Parquet file {self._path!r} ({self._groups} row groups)"
            )
        if group != self._group:
            self._decoded = None
        self._group, self._row, self._rows = group, row, []

    def close(self) -> None:
        if not self._closed:
            self._decoded, self._rows = None, []
            self._drop_ahead()
            if self._pool is not None:
                self._pool.shutdown(wait=True)
            self._file.close()
        super().close()

    def __repr__(self) -> str:
        return f"ParquetFileIterator({self._path!r})"
