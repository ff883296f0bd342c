"""TFRecord files as a record format of the converter, read by granary's one frame codec.

A converter must know each record's position (Beam's ``ReadFromTFRecord`` yields bare
records, and their order is lost at the next shuffle), and an error must name the file
and the byte offset, so records are read here in our own loop through
:mod:`dataloader.sources.tfrecord.frames`, the frame codec every TFRecord reader of
granary uses: a damaged frame fails with the same error as in the loader. Beam's TFRecord
source is unsplittable anyway (one file is one sequential read), so reading a file in one
``DoFn`` loses no parallelism.

Counting and skipping use the framing only (:func:`~dataloader.sources.tfrecord.frames.scan_frames`):
they read each 12-byte header, check the length's CRC and seek past the data, so cutting
a file into shards does not read its data twice. Reading checks both CRCs of every
record, the data read in bounded chunks. A gzipped file
(:func:`dataloader.beam.record_files.for_file` opens it) is a stream that seeks forward
only by decompressing, so skipping never seeks back and never asks for the stream's
size; offsets in messages are then offsets in the decompressed data.
"""

from __future__ import annotations

import gzip
import io
import itertools
from collections.abc import Iterator
from typing import IO

from dataloader.beam.record_files import Opener, RecordFormat, open_local
from dataloader.sources.tfrecord.frames import OVERHEAD, crc32c, read_frame, scan_frames


def _size(f: IO[bytes]) -> int | None:
    """The file's size; None for a gzip stream, which learns it only by decompressing."""
    return None if isinstance(f, gzip.GzipFile) else f.seek(0, io.SEEK_END)


def count(path: str, open_file: Opener = open_local) -> int:
    """The number of records of a TFRecord file (headers checked, data not read)."""
    with open_file(path) as f:
        return sum(1 for _ in scan_frames(f, path, crc32c(), _size(f)))


def read(path: str, open_file: Opener = open_local, start: int = 0,
         stop: int | None = None) -> Iterator[bytes]:
    """Records ``start`` to ``stop`` (exclusive) of a TFRecord file, CRCs checked."""
    crc = crc32c()
    with open_file(path) as f:
        size = _size(f)
        offset, skipped = 0, 0
        for at, length in itertools.islice(scan_frames(f, path, crc, size), start):
            offset, skipped = at + OVERHEAD + length, skipped + 1
        if skipped < start:
            return  # fewer than start + 1 records
        f.seek(offset)
        for _ in range(start, stop) if stop is not None else itertools.count(start):
            record = read_frame(f, path, offset, crc, size)
            if record is None:
                return
            yield record
            offset += OVERHEAD + len(record)


TFRECORD = RecordFormat("tfrecord", count, read)
