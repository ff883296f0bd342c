"""Where the records of a TFRecord file start, from its headers alone, kept in the
metadata index (:mod:`..files.metadata_index`) so a job reads each file's headers once.

A TFRecord file has no index of its own, but every frame starts with its length:
:func:`scan_record_starts` walks the 12-byte headers with the one frame codec
(:func:`.frames.scan_frames`: each length checked against its CRC, the data skipped
with a seek). It stops at a damaged frame rather than raising: the frame counts as one
more record, whose read fails, where a stream reading the file in order fails.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..files.metadata_index import FileStat, pack_ints, resolve, stat_local, unpack_ints
from .frames import OVERHEAD, crc32c, scan_frames


def scan_record_starts(path: str) -> tuple[np.ndarray, bool]:
    """Where each record of the local TFRecord file ``path`` starts, then where the last
    good one ends; and whether a damaged frame follows the good records there (a header
    whose CRC fails, or a length past the end of the file)."""
    starts, end, damaged = [], 0, False
    with open(path, "rb") as file:
        try:
            for offset, length in scan_frames(file, path, crc32c(), os.fstat(file.fileno()).st_size):
                starts.append(offset)
                end = offset + OVERHEAD + length
        except ValueError:  # a damaged frame: the one more record whose read fails
            damaged = True
    starts.append(end)
    return np.asarray(starts, dtype=np.int64), damaged


def record_starts(paths: Sequence[str], index: Any = None) -> list[tuple[np.ndarray, bool]]:
    """:func:`scan_record_starts` of each file, through the metadata index (``index``: None
    for the index beside the data, if any; see :mod:`..files.metadata_index`).

    Raises:
        ValueError: the index has a stale entry for a file.
    """
    metas = resolve([stat_local(path) for path in paths], "tfrecord", read_metadata, index)
    return [(unpack_ints(m["starts"]), bool(m["damaged"])) for m in metas]


def read_metadata(stats: Sequence[FileStat]) -> list[dict[str, Any]]:
    """What the metadata index keeps of each local TFRecord file: where its records start
    (:func:`scan_record_starts`), read here."""
    metas = []
    for stat in stats:
        starts, damaged = scan_record_starts(stat.path)
        metas.append({"starts": pack_ints(starts), "damaged": damaged})
    return metas
