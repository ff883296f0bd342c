"""The chunk index of an ArrayRecord file, read from its last bytes.

An ArrayRecord file is a Riegeli file: 64 KiB blocks, each starting with a 24-byte
block header, holding a sequence of chunks (a 40-byte chunk header, then the chunk's
data). Its last block holds the *postscript* chunk, whose records say where the
*footer* chunk starts; the footer's records are one ``RiegeliFooterMetadata`` (number
of chunks and records, the writer's options) and then one ``ArrayRecordFooter`` per
chunk (its offset, decoded size and number of records).

This module reads only those two chunks, the file's index, which is what a remote
reader needs to know which byte range holds a record. The chunks that hold records
are never decoded here: array_record's reader decodes them (see
:mod:`.array_record`). Both index chunks are "simple" Riegeli chunks: a compression
byte, the record sizes and the record bytes, each compressed as a whole with the
writer's codec (zstd by default; brotli, snappy or none), which pyarrow decompresses.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..files.metadata_index import pack_ints, unpack_ints

BLOCK = 1 << 16
_BLOCK_HEADER = 24
_CHUNK_HEADER = 40
_CODECS = {ord("z"): "zstd", ord("b"): "brotli", ord("s"): "snappy"}


class NotAnIndexError(ValueError):
    """The last bytes of a file are not an ArrayRecord index (another format, truncated)."""


@dataclasses.dataclass(frozen=True, eq=False)
class ChunkIndex:
    """Where each chunk of one ArrayRecord file lies, and how many records it holds.

    Attributes:
        size: The file's size in bytes.
        offsets: ``num_chunks + 1`` byte offsets: chunk ``k`` is ``[offsets[k],
            offsets[k + 1])`` (block headers and padding included); the last is where
            the footer starts.
        first_record: ``num_chunks + 1`` record numbers: chunk ``k`` holds records
            ``[first_record[k], first_record[k + 1])``.
        writer_options: The writer's options string (``group_size:1,...``).
    """

    size: int
    offsets: np.ndarray
    first_record: np.ndarray
    writer_options: str

    @property
    def num_records(self) -> int:
        return int(self.first_record[-1])

    @property
    def num_chunks(self) -> int:
        return len(self.offsets) - 1

    def chunks_of(self, positions: np.ndarray) -> np.ndarray:
        """The chunk of each record position (positions within this file)."""
        return np.searchsorted(self.first_record, positions, side="right") - 1

    def to_json(self) -> dict[str, Any]:
        """A compact JSON form (offsets and counts as zlib'd base64 of their deltas)."""
        return {
            "size": self.size,
            "offsets": pack_ints(self.offsets),
            "first_record": pack_ints(self.first_record),
            "writer_options": self.writer_options,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ChunkIndex:
        return cls(
            int(data["size"]), unpack_ints(data["offsets"]), unpack_ints(data["first_record"]),
            str(data["writer_options"]),
        )


def tail_start(size: int, guess: int) -> int:
    """Where to start reading a file of ``size`` bytes to get its index in one request."""
    return max(0, size - max(guess, BLOCK))


def footer_offset(tail: bytes, size: int) -> int:
    """The footer's offset, from the file's last bytes (at least its last block)."""
    if size < BLOCK or size % BLOCK or len(tail) < BLOCK:
        raise NotAnIndexError(f"size {size} is not a whole number of 64 KiB blocks")
    block = _strip(tail[-BLOCK:], size - BLOCK)
    records = _records(block)
    if not records:
        raise NotAnIndexError("the postscript chunk holds no record")
    fields = _fields(records[0])
    if fields.get(2) != 0x71930E704FDAE05E:
        raise NotAnIndexError("the postscript's magic number is not ArrayRecord's")
    return int(fields[1])


def parse(tail: bytes, tail_at: int, size: int) -> ChunkIndex:
    """The index from ``tail``, the file's bytes from ``tail_at`` to its end.

    Raises:
        NotAnIndexError: ``tail`` does not reach back to the footer, or is not an index.
    """
    start = footer_offset(tail, size)
    if start < tail_at:
        raise NotAnIndexError(f"the footer starts at {start}, before the bytes read ({tail_at})")
    records = _records(_strip(tail[start - tail_at : size - BLOCK - tail_at], start))
    if not records:
        raise NotAnIndexError("the footer chunk holds no record")
    metadata = _fields(_fields(records[0]).get(1, b""))
    chunks = [_fields(record) for record in records[1:]]
    offsets = np.array([c.get(1, 0) for c in chunks] + [start], dtype=np.int64)
    counts = np.array([c.get(3, 0) for c in chunks], dtype=np.int64)
    first = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    options = metadata.get(4, b"")
    return ChunkIndex(size, offsets, first, options.decode() if isinstance(options, bytes) else "")


def _strip(data: bytes, at: int) -> bytes:
    """``data`` (the file's bytes from ``at``) without the block headers inside it."""
    out = bytearray()
    i, position = 0, at
    while i < len(data):
        if position % BLOCK == 0:
            i += _BLOCK_HEADER
            position += _BLOCK_HEADER
            continue
        n = min(BLOCK - position % BLOCK, len(data) - i)
        out += data[i : i + n]
        i += n
        position += n
    return bytes(out)


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(data):
            raise NotAnIndexError("a varint runs past the end of the index")
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, i


def _decompress(data: bytes, codec: int) -> bytes:
    if codec == 0:
        return data
    if codec not in _CODECS:
        raise NotAnIndexError(f"unknown compression {codec!r} in the index")
    import pyarrow

    size, i = _varint(data, 0)
    return pyarrow.decompress(data[i:], decompressed_size=size, codec=_CODECS[codec]).to_pybytes()


def _records(chunk: bytes) -> list[bytes]:
    """The records of one simple chunk (its header, then its data)."""
    if len(chunk) < _CHUNK_HEADER:
        raise NotAnIndexError("a chunk is shorter than its header")
    (data_size,) = struct.unpack_from("<Q", chunk, 8)
    count = int.from_bytes(chunk[25:32], "little")
    data = chunk[_CHUNK_HEADER : _CHUNK_HEADER + data_size]
    if len(data) != data_size or not data:
        raise NotAnIndexError("a chunk's data is cut short")
    sizes_size, i = _varint(data, 1)
    sizes = _decompress(data[i : i + sizes_size], data[0])
    values = _decompress(data[i + sizes_size :], data[0])
    records, j, k = [], 0, 0
    for _ in range(count):
        length, j = _varint(sizes, j)
        records.append(values[k : k + length])
        k += length
    return records


def _fields(message: bytes) -> dict[int, Any]:
    """The varint and bytes fields of a protocol buffer message, by field number."""
    fields: dict[int, Any] = {}
    i = 0
    while i < len(message):
        key, i = _varint(message, i)
        if key & 7 == 0:
            fields[key >> 3], i = _varint(message, i)
        elif key & 7 == 2:
            length, i = _varint(message, i)
            fields[key >> 3] = message[i : i + length]
            i += length
        elif key & 7 == 1:
            fields[key >> 3] = int.from_bytes(message[i : i + 8], "little")
            i += 8
        elif key & 7 == 5:
            fields[key >> 3] = int.from_bytes(message[i : i + 4], "little")
            i += 4
        else:
            raise NotAnIndexError(f"unexpected wire type {key & 7} in the index")
    return fields
