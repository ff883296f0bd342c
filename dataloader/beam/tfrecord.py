"""TFRecord files read in order with Apache Beam's own TFRecord codec.

A TFRecord is ``length (8 bytes) | masked CRC32C of length (4) | data | masked CRC32C
of data (4)``. Beam's ``ReadFromTFRecord`` decodes it with ``_TFRecordUtil``; we call
that same codec from our own loop rather than the ``ReadFromTFRecord`` transform for
two reasons: a converter must know each record's position (the transform yields bare
records, and their order is lost at the next shuffle), and an error must name the file
and the byte offset (Beam's says "Not a valid TFRecord" with a hex dump of the record).
Beam's TFRecord source is unsplittable anyway (one file is one sequential read), so
reading a file in one ``DoFn`` loses no parallelism.

Records are read with Beam's CRC (``_TFRecordUtil._masked_crc32c``) in our own loop,
the data in bounded chunks, so a damaged length field never allocates what it claims.
Counting and skipping use the framing only: they read each 12-byte header, check the
length's CRC and seek past the data, so cutting a file into shards does not read its
data twice. Reading checks both CRCs of every record. A gzipped file
(:func:`dataloader.beam.record_files.for_file` opens it) is a stream that seeks
forward only by decompressing, so skipping never seeks back and never asks for the
stream's size; offsets in messages are then offsets in the decompressed data.
"""

from __future__ import annotations

import gzip
import io
import itertools
import struct
from collections.abc import Iterator
from typing import IO

from apache_beam.io.tfrecordio import _TFRecordUtil

from dataloader.beam.record_files import Opener, RecordFormat, open_local
from dataloader.sources.tfrecord import read_bounded

_HEADER = 12  # length (8) + masked CRC of the length (4)
_FOOTER = 4  # masked CRC of the data


def _frames(path: str, f: IO[bytes]) -> Iterator[tuple[int, int]]:
    """(byte offset, data length) of every record, checking only the headers.

    ``f`` is past a record when it is yielded: at the start of the next one.
    """
    # A gzip stream learns its size by decompressing all of it: find the end by reading.
    size = None if isinstance(f, gzip.GzipFile) else f.seek(0, io.SEEK_END)
    f.seek(0)
    offset = 0
    while size is None or offset < size:
        header = f.read(_HEADER)
        if not header and size is None:
            return
        if len(header) < _HEADER:
            raise ValueError(
                f"{path}: truncated at byte offset {offset}: {len(header)} bytes left of "
                f"a {_HEADER}-byte record header (file size {offset + len(header) if size is None else size})"
            )
        length, length_crc = struct.unpack("<QI", header)
        if _TFRecordUtil._masked_crc32c(header[:8]) != length_crc:
            raise ValueError(
                f"{path}: record header at byte offset {offset} fails its CRC check (a "
                "corrupt file, or not a TFRecord file)"
            )
        end = offset + _HEADER + length + _FOOTER
        # A gzip stream's seek stops at its end and says where.
        reached = f.seek(end) if size is None or end <= size else size
        if reached < end:
            raise ValueError(
                f"{path}: truncated at byte offset {offset}: the record there needs "
                f"{end - offset} bytes, the file has {reached - offset} left (file size {reached})"
            )
        yield offset, length
        offset = end


def _seek_to_record(path: str, f: IO[bytes], index: int) -> bool:
    """Moves ``f`` to record ``index`` by its framing; False when there is no such record."""
    return sum(1 for _ in itertools.islice(_frames(path, f), index)) == index


def count(path: str, open_file: Opener = open_local) -> int:
    """The number of records of a TFRecord file (headers checked, data not read)."""
    with open_file(path) as f:
        return sum(1 for _ in _frames(path, f))


def read(path: str, open_file: Opener = open_local, start: int = 0,
         stop: int | None = None) -> Iterator[bytes]:
    """Records ``start`` to ``stop`` (exclusive) of a TFRecord file, CRCs checked."""
    with open_file(path) as f:
        if start and not _seek_to_record(path, f, start):
            return  # fewer than start + 1 records
        index = start
        while stop is None or index < stop:
            offset = f.tell()
            try:
                record = _read_record(f)
            except ValueError as error:
                raise ValueError(f"{path}: record {index} at byte offset {offset}: {error}") from None
            if record is None:
                return
            yield record
            index += 1


def _read_record(f: IO[bytes]) -> bytes | None:
    """The next record's data (None at the end), both CRCs checked with Beam's codec.

    Beam's ``_TFRecordUtil.read_record`` does the same but reads the data with one
    ``read(length)``, which allocates the length a damaged header claims before finding
    the file short; this reads it in bounded chunks.
    """
    header = f.read(_HEADER)
    if not header:
        return None
    if len(header) < _HEADER:
        raise ValueError(f"truncated: {len(header)} bytes left of a {_HEADER}-byte record header")
    length, length_crc = struct.unpack("<QI", header)
    if _TFRecordUtil._masked_crc32c(header[:8]) != length_crc:
        raise ValueError("its length fails the CRC check")
    body = read_bounded(f, length + _FOOTER)
    if len(body) < length + _FOOTER:
        raise ValueError(f"truncated: its length field says {length:,} bytes of data (plus a "
                         f"{_FOOTER}-byte checksum), {len(body):,} bytes are left")
    data = body[:length]
    if _TFRecordUtil._masked_crc32c(data) != struct.unpack_from("<I", body, length)[0]:
        raise ValueError("its data fails the CRC check")
    return data


TFRECORD = RecordFormat("tfrecord", count, read)
