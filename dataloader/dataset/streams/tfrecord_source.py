"""A TFRecord stream as a random-access source over its stream order, for worker processes.

``TFRecordIterDataset(...).map(f)`` runs on the engine: its source is
:class:`TFRecordStreamSource`, whose record ``p`` is record ``p`` of the stream that
``TFRecordIterDataset`` yields (files interleaved as :mod:`~dataloader.dataset.streams.order`
computes from the record counts).

A TFRecord file has no index, but every frame starts with its length, so
:func:`record_offsets` finds where each record starts by reading the 12-byte headers
alone (:func:`~dataloader.sources.tfrecord.index.scan_record_starts`, with the one frame
codec: each length checked against its CRC, the data skipped with a seek), or takes them
from the metadata index. The index is built once, in the process that builds the pipeline (it needs the record counts anyway
to know the stream's length and order), kept per file in that process, and travels to
the workers with the source: 8 bytes a record, which unpickles far faster than a worker
could read the headers again. Past :data:`SHIPPED_RECORDS` records (64 MB of offsets a
worker) the source travels without it, and each worker reads the headers of a file the
first time it reads from it (checking that it finds the records the order counted).

A work unit is a run of consecutive positions; ``__getitems__`` reads, for each file
the run touches, the contiguous bytes of its records with one ``pread`` and checks both
CRCs of every record with the stream's frame codec
(:func:`~dataloader.sources.tfrecord.frames.unpack_frame`). A damaged frame (a header whose CRC fails, a
length past the end of the file, a data CRC that fails) fails at the position where the
stream fails, with the stream's own error: the indexing stops at a damaged header and
counts it as one more record, whose read is the stream's reader at that offset.

Gzip files (``.gz``) cannot be read from an offset without decompressing what comes
before, so a stream with one keeps running at the iterator level.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from dataloader.dataset.streams.order import InterleaveOrder
from dataloader.errors import StateMismatchError
from dataloader.sources import TFRecordReader
from dataloader.sources.files.handles import OPEN_FILES, open_raw, read_range
from dataloader.sources.files.paths import PerProcessHandles
from dataloader.sources.tfrecord.frames import crc32c, unpack_frame
from dataloader.sources.tfrecord.index import record_starts

SHIPPED_RECORDS = 1 << 23
"""The most records whose offsets travel with the source to each worker."""


class FileIndex:
    """Where the records of one TFRecord file start.

    Attributes:
        starts: the byte offset of each good record, and last the end of the last one.
        damaged: whether a damaged frame follows the good records (at ``starts[-1]``):
            it counts as one more record, whose read fails as the stream's does.
    """

    def __init__(self, starts: np.ndarray, damaged: bool) -> None:
        self.starts = starts
        self.damaged = damaged

    def __len__(self) -> int:
        return len(self.starts) - 1 + int(self.damaged)


def record_offsets(path: str, index: Any = None) -> FileIndex:
    """The index of ``path`` (see :func:`record_offsets_of`)."""
    return record_offsets_of([path], index)[0]


# Offsets resolved in this process, by (path, size, time of change).
_KNOWN: dict[tuple[str, int, int], FileIndex] = {}
_KNOWN_KEPT = 4096


def record_offsets_of(paths: Sequence[str], index: Any = None) -> list[FileIndex]:
    """The index of each file (see the module), from the metadata index (``index``, None:
    the one beside the data, if any; all files looked up at once) or its headers; resolved
    once per process for a file of a given size and time of change (MaxText's file list
    makes one dataset per file and epoch: the headers are read once for all of them)."""
    keys = []
    for path in paths:
        info = os.stat(path)
        keys.append((path, info.st_size, info.st_mtime_ns))
    missing = [key for key in dict.fromkeys(keys) if key not in _KNOWN]
    if missing:
        if len(_KNOWN) + len(missing) > _KNOWN_KEPT:
            _KNOWN.clear()
        found = record_starts([path for path, _, _ in missing], index)
        for key, (starts, damaged) in zip(missing, found):
            _KNOWN[key] = FileIndex(starts, damaged)
    return [_KNOWN[key] for key in keys]


class TFRecordStreamSource(PerProcessHandles):
    """Records (``bytes``) of TFRecord files in stream order, by position.

    Args:
        paths: the files (local, not gzip), in the order they are opened.
        indexes: the :class:`FileIndex` of each file.
        cycle_length: files read at a time.
    """

    def __init__(self, paths: Sequence[str], indexes: Sequence[FileIndex], cycle_length: int) -> None:
        self._paths = list(paths)
        self._indexes: list[FileIndex | None] = list(indexes)
        self.order = InterleaveOrder([len(i) for i in indexes], cycle_length)
        self._init_process_state()

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        if len(self) > SHIPPED_RECORDS:  # too large to send: workers index the files they read
            state["_indexes"] = [None] * len(self._paths)
        return state

    def _index(self, file: int) -> FileIndex:
        """The index of ``file``, read here the first time if it did not travel."""
        index = self._indexes[file]
        if index is None:
            index = record_offsets(self._paths[file])
            if len(index) != int(self.order.counts[file]):
                raise ValueError(
                    f"TFRecord file {self._paths[file]!r} has {len(index)} records now but had "
                    f"{int(self.order.counts[file])} when the pipeline was built; restart the "
                    f"pipeline to read it as it is now"
                )
            self._indexes[file] = index
        return index

    def _file_keys(self) -> list[tuple[str, str]]:
        return [("file", path) for path in self._paths]

    def __len__(self) -> int:
        return len(self.order)

    def _read(self, file: int, low: int, high: int) -> bytes:
        """The bytes of the good records ``low .. high - 1`` of ``file``, read at once."""
        starts = self._index(file).starts
        begin, size = int(starts[low]), int(starts[high] - starts[low])
        with OPEN_FILES.hold([("file", self._paths[file])], open_raw) as (handle,):
            return read_range(handle, begin, size)

    def _offset(self, file: int, row: int) -> int:
        """The byte offset of record ``row`` of ``file`` (the damaged frame's, past the
        good records)."""
        starts = self._index(file).starts
        return int(starts[min(row, len(starts) - 1)])

    def _fail(self, file: int, row: int) -> ValueError:
        """The stream's error for record ``row`` of ``file``, read by the stream's reader."""
        offset = self._offset(file, row)
        try:
            with TFRecordReader(self._paths[file], offset) as reader:
                reader.read()
        except ValueError as error:
            return error
        return ValueError(
            f"TFRecord file {self._paths[file]!r} changed after it was indexed (the record at "
            f"byte offset {offset} reads now); restart the pipeline to index it again"
        )

    def _records(self, file: int, low: int, high: int) -> list[bytes]:
        """Records ``low .. high - 1`` of ``file``, both CRCs of each checked."""
        index = self._index(file)
        good = min(high, len(index.starts) - 1)
        out: list[bytes] = []
        if low < good:
            crc, path, base = crc32c(), self._paths[file], int(index.starts[low])
            data = memoryview(self._read(file, low, good))
            ends = (index.starts[low:good + 1] - base).tolist()
            for row, at, end in zip(range(low, good), ends, ends[1:]):
                # The frame's end is checked against the index too: a file rewritten since
                # it was indexed fails here, never yields a record cut at the wrong place.
                try:
                    record, found = unpack_frame(data, at, path, base + at, crc)
                except ValueError:
                    found = -1
                if found != end:
                    raise self._fail(file, row)
                out.append(record)
        if high > good:  # the damaged frame that ends the file
            raise self._fail(file, good)
        return out

    def __getitem__(self, position: Any) -> bytes:
        return self.__getitems__([int(position)])[0]

    def __getitems__(self, positions: Sequence[int] | np.ndarray) -> list[bytes]:
        """The records at ``positions`` in the order given; each file's records among
        them are read as one contiguous range, one read a file."""
        files, rows = self.order.locate(positions)
        out: list[Any] = [None] * len(files)
        for f in np.unique(files).tolist():
            where = np.flatnonzero(files == f)
            low = int(rows[where].min())
            records = self._records(f, low, int(rows[where].max()) + 1)
            for i, r in zip(where.tolist(), (rows[where] - low).tolist()):
                out[i] = records[r]
        return out

    def record_location(self, position: Any) -> str:
        """Where stream record ``position`` lives: its file and byte offset."""
        f, r = (int(x[0]) for x in self.order.locate([int(position)]))
        return f"file {self._paths[f]!r} (record {r}, byte offset {self._offset(f, r)})"

    def _file_position(self, file: int, state: dict[str, Any]) -> int:
        """Records of ``file`` handed out at a state ``{"path", "reader_offset"}``."""
        name = os.path.basename(self._paths[file])
        if "path" in state and state["path"] != name:
            raise StateMismatchError(
                f"this state was saved while reading the file {state['path']!r}, not {name!r}; "
                f"restore with the files (and file order) the state was made for"
            )
        starts = self._index(file).starts
        offset = int(state["reader_offset"])
        row = int(np.searchsorted(starts, offset))
        if row >= len(starts) or int(starts[row]) != offset:
            raise StateMismatchError(
                f"offset {offset} is not the start of a record of TFRecord file "
                f"{self._paths[file]!r}; restore with the files the state was made for"
            )
        return row

    def position_of_state(self, state: dict[str, Any]) -> int:
        """The stream position of a state of the streaming iterators: one file's
        ``{"path", "reader_offset"}``, or the interleave's over several files.

        Raises:
            StateMismatchError: the state is of another shape, file list or stage.
        """
        if "reader_offset" in state:
            if len(self._paths) != 1:
                raise StateMismatchError(
                    f"this state is of one TFRecord file but this stream reads {len(self._paths)} "
                    f"files; restore with the file the state was made for"
                )
            return self._file_position(0, state)
        if "iterators_in_use_states" not in state or "next_index_in_datasets" not in state:
            raise StateMismatchError(
                f"{sorted(state)} is not a state of a TFRecord stream; pass a state that "
                f"get_state() of this pipeline returned"
            )
        return self.order.position_of_state(state, self._file_position)

    def __repr__(self) -> str:
        shown = os.path.basename(self._paths[0]) if len(self._paths) == 1 else f"{len(self._paths)} files"
        return f"TFRecordStreamSource({shown!r})"
