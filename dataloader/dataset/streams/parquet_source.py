"""A Parquet stream as a random-access source over its stream order, for worker processes.

``ParquetIterDataset(...).map(f)`` runs on the engine: its source is
:class:`ParquetStreamSource`, whose record ``p`` is row ``p`` of the stream that
``ParquetIterDataset`` yields (files interleaved as :mod:`~dataloader.dataset.streams.order`
computes from the row counts of the files' footers, read once at construction and
carried with the source). A work unit is a run of consecutive positions; a worker reads
it with one ``__getitems__``, which decodes each row group it touches once (only the
selected columns) and keeps the last few decoded per process, so the next unit of the
same worker, which reads on in the same row groups, decodes nothing again. The rows are
the streaming iterator's own (the same decoder), so the output does not depend on where
it was computed.

:func:`position_of_state` reads the streaming iterators' states (one file's
``{"path", "row_group", "index_within_row_group"}``, and the interleave's over several
files) as a position of this source, so a checkpoint written before a pipeline ran on the
engine, or by Grain's ``ParquetIterDataset``, continues on it.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from dataloader.dataset.streams.order import InterleaveOrder
from dataloader.errors import StateMismatchError
from dataloader.sources.files.handles import OPEN_FILES
from dataloader.sources.files.paths import PerProcessHandles


def _open(path: str, read_kwargs: dict[str, Any]) -> Any:
    from dataloader.sources.remote.urls import parquet_file  # a path or a URL

    return parquet_file(path, **read_kwargs)


class ParquetStreamSource(PerProcessHandles):
    """Rows of Parquet files in stream order, by position.

    Args:
        paths: the files, in the order they are opened.
        group_rows: the rows of each row group of each file (from the footers).
        columns: the columns to read (None: every column of each file).
        read_kwargs: keyword arguments of ``pyarrow.parquet.ParquetFile``.
        cycle_length: files read at a time.
    """

    _TRANSIENT = ("_cache",)

    def __init__(
        self,
        paths: Sequence[str],
        group_rows: Sequence[Sequence[int]],
        columns: list[str] | None,
        read_kwargs: dict[str, Any],
        cycle_length: int,
    ) -> None:
        self._paths = list(paths)
        self._columns = columns
        self._read_kwargs = dict(read_kwargs)
        # Row offset of each row group in its file (and the file's row count last).
        self._group_starts = [np.concatenate([[0], np.cumsum(g, dtype=np.int64)]) for g in group_rows]
        self.order = InterleaveOrder([int(s[-1]) for s in self._group_starts], cycle_length)
        # A unit reads on in the current row group of every open file, and the next unit
        # of this process continues there: keep those (and two more, for the files that
        # move to their next group). Every worker holds as many decoded groups as the
        # streaming iterator does in one process, so no more: they can be large.
        self._cache_size = self.order.cycle_length + 2
        self._init_process_state()

    def _reset_handles(self) -> None:
        self._cache: collections.OrderedDict[tuple[int, int], Any] = collections.OrderedDict()

    def _key(self, file: int) -> tuple[Any, ...]:
        """File ``file`` in the shared cache of open files: shared with ``ParquetDataSource``
        when opened without keyword arguments, else this source's own."""
        if not self._read_kwargs:
            return ("parquet", self._paths[file])
        return ("parquet", self._paths[file], id(self))

    def _file_keys(self) -> list[tuple[Any, ...]]:
        return [self._key(f) for f in range(len(self._paths))]

    def _open_key(self, key: tuple[Any, ...]) -> Any:
        return _open(key[1], self._read_kwargs)

    def __len__(self) -> int:
        return len(self.order)

    def _group(self, file: int, group: int) -> Any:
        """Row group ``group`` of file ``file``, decoded (once per process while cached)."""
        from dataloader.sources._parquet_rows import DecodedRowGroup

        self._ensure_own_process()
        key = (file, group)
        with self._lock:
            decoded = self._cache.get(key)
            if decoded is not None:
                self._cache.move_to_end(key)
                return decoded
            with OPEN_FILES.hold([self._key(file)], self._open_key) as (handle,):
                try:
                    table = handle.read_row_group(group, columns=self._columns)
                except Exception as error:
                    raise ValueError(
                        f"Parquet file {self._paths[file]!r}: row group {group} cannot be read: {error}"
                    ) from error
            decoded = self._cache[key] = DecodedRowGroup(table)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
            return decoded

    def __getitem__(self, position: Any) -> dict[str, Any]:
        return self.__getitems__([int(position)])[0]

    def __getitems__(self, positions: Sequence[int] | np.ndarray) -> list[dict[str, Any]]:
        """The rows at ``positions`` in the order given; each row group touched is
        decoded at most once per call, and its rows are built a run at a time."""
        files, rows = self.order.locate(positions)
        out: list[Any] = [None] * len(files)
        wanted: dict[tuple[int, int], list[int]] = {}
        for i, (f, r) in enumerate(zip(files.tolist(), rows.tolist())):
            group = int(np.searchsorted(self._group_starts[f], r, side="right")) - 1
            wanted.setdefault((f, group), []).append(i)
        for (f, group), where in wanted.items():
            base = int(self._group_starts[f][group])
            local = [int(rows[i]) - base for i in where]
            low, high = min(local), max(local) + 1
            built = self._group(f, group).rows(low, high)
            for i, r in zip(where, local):
                out[i] = built[r - low]
        return out

    def record_location(self, position: Any) -> str:
        """Where stream row ``position`` lives: its file, row group and row there."""
        files, rows = self.order.locate([int(position)])
        f, r = int(files[0]), int(rows[0])
        group = int(np.searchsorted(self._group_starts[f], r, side="right")) - 1
        return (f"file {self._paths[f]!r} (row group {group}, row "
                f"{r - int(self._group_starts[f][group])})")

    def _file_position(self, file: int, state: dict[str, Any]) -> int:
        """Rows of ``file`` handed out at a streaming file state."""
        starts = self._group_starts[file]
        if "path" in state and state["path"] != os.path.basename(self._paths[file]):
            raise StateMismatchError(
                f"this state was saved while reading the file {state['path']!r}, not "
                f"{os.path.basename(self._paths[file])!r}; restore with the files (and file "
                f"order) the state was made for"
            )
        group, row = int(state["row_group"]), int(state["index_within_row_group"])
        if not 0 <= group < len(starts) or row < 0:
            raise StateMismatchError(
                f"row group {group} is outside Parquet file {self._paths[file]!r} "
                f"({len(starts) - 1} row groups); restore with the files the state was made for"
            )
        return min(int(starts[group]) + row, int(starts[-1]))

    def position_of_state(self, state: dict[str, Any]) -> int:
        """The stream position of a state of the streaming iterators (see the module).

        Raises:
            StateMismatchError: the state is of another shape, file list or stage.
        """
        if "row_group" in state and "index_within_row_group" in state:
            if len(self._paths) != 1:
                raise StateMismatchError(
                    f"this state is of one Parquet file but this stream reads {len(self._paths)} "
                    f"files; restore with the file the state was made for"
                )
            return self._file_position(0, state)
        if "iterators_in_use_states" in state and "next_index_in_datasets" in state:
            return self.order.position_of_state(state, self._file_position)
        raise StateMismatchError(
            f"{sorted(state)} is not a state of a Parquet stream; pass a state that "
            f"get_state() of this pipeline returned"
        )

    def __repr__(self) -> str:
        shown = os.path.basename(self._paths[0]) if len(self._paths) == 1 else f"{len(self._paths)} files"
        cols = "" if self._columns is None else f", columns={self._columns}"
        return f"ParquetStreamSource({shown!r}{cols})"
