"""TFRecord framing, read and written in one place: every TFRecord reader of granary uses it.

A TFRecord file is a plain sequence of frames, one a record::

    uint64  length of the data, little-endian
    uint32  masked CRC32C of those 8 length bytes
    bytes   the data (length bytes)
    uint32  masked CRC32C of the data

A masked CRC is ``((crc >> 15) | (crc << 17)) + 0xA282EAD8`` modulo ``2**32``
(TensorFlow's ``crc32c::Mask``). :func:`frame` writes a frame; :func:`read_frame` reads
one from a file object, :func:`scan_frames` walks the headers alone (the data skipped
with a seek), :func:`unpack_frame` reads one from bytes already in memory. Each checks
what it reads the same way and refuses a damaged frame with the same ``ValueError``
(:func:`damaged`), naming the file, the byte offset of the record and what failed, so a
corrupt shard reads the same through the stream, the workers' source, Grain's
compatibility reader and the converter.

Data is read in chunks of at most ``CHUNK_BYTES`` (:func:`read_bounded`), and a length
is checked against the file's size where it is known before its data is read, so a
damaged length field (a 44-byte file that claims a record of 2**60 bytes) costs what the
file holds, never the claimed size.

The CRC32C comes from ``google-crc32c`` (Google's C library, using the CPU's CRC
instruction where there is one; about 0.4 us for a 1 KB record), the optional extra
``pip install 'granary[tfrecord]'``, imported only when a TFRecord is read or written.
"""

from __future__ import annotations

import functools
import gzip
import struct
import zlib
from collections.abc import Callable, Iterator
from typing import Any

HEADER = struct.Struct("<QI")  # length, masked CRC of the length
FOOTER = struct.Struct("<I")  # masked CRC of the data
OVERHEAD = HEADER.size + FOOTER.size
_MASK_DELTA = 0xA282EAD8
# Errors of a damaged gzip stream (a ``.tfrecord.gz`` file is read through ``gzip``).
GZIP_ERRORS = (gzip.BadGzipFile, EOFError, zlib.error)
# The most one read() asks for: Python's read(n) allocates n bytes before reading, so a
# length field is never passed to it whole (see read_bounded).
CHUNK_BYTES = 1 << 24

Crc = Callable[[bytes], int]


@functools.cache
def crc32c() -> Crc:
    """Google's CRC32C function; ImportError with what to install when it is missing."""
    try:
        import google_crc32c
    except ImportError:
        raise ImportError(
            "reading and writing TFRecord files checks CRC32C checksums with the "
            "google-crc32c package; install it: pip install 'granary[tfrecord]' "
            "(or pip install google-crc32c)"
        ) from None
    return google_crc32c.value


def masked_crc(data: bytes, crc: Crc | None = None) -> int:
    """The masked CRC32C of ``data``, as TFRecord stores it."""
    value = (crc or crc32c())(data)
    return ((((value >> 15) | (value << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def frame(data: bytes, crc: Crc) -> tuple[bytes, bytes]:
    """The header and the footer that go before and after ``data`` in a TFRecord file."""
    length = struct.pack("<Q", len(data))
    return length + FOOTER.pack(masked_crc(length, crc)), FOOTER.pack(masked_crc(data, crc))


def read_bounded(file: Any, size: int) -> bytes:
    """``size`` bytes of ``file``, or fewer if it ends first, read in bounded chunks.

    ``file.read(n)`` allocates ``n`` bytes up front, so reading a length taken from a
    damaged file in one call can ask for gigabytes (or fail with ``OverflowError``)
    before finding that the file is short. Here memory grows only with the bytes that
    are really there.
    """
    if size <= CHUNK_BYTES:
        return bytes(file.read(size))
    parts, left = [], size
    while left:
        part = file.read(min(left, CHUNK_BYTES))
        if not part:
            break
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def damaged(path: str, offset: int, what: str, length: int = 0, left: int = 0) -> ValueError:
    """The one error for a damaged frame, whoever reads it.

    Args:
        path: the file, as the reader names it.
        offset: the byte offset of the record (of the decompressed data, for gzip).
        what: ``"header"`` (the file ends inside the 12-byte header, ``left`` bytes of
            it there), ``"length"`` (the length fails its CRC), ``"data"`` (the data fails
            its CRC), ``"short"`` (the file ends inside the record: ``length`` claimed,
            ``left`` bytes after the header).
    """
    where = f"TFRecord file {path!r}"
    if what == "header":
        return ValueError(f"{where} is truncated: the record at byte offset {offset} needs "
                          f"{HEADER.size} bytes but the file ends after {left}; rewrite or drop the file")
    if what == "length":
        return ValueError(f"{where}: the length of the record at byte offset {offset} fails its "
                          f"CRC check; the file is corrupt or not a TFRecord file")
    if what == "data":
        return ValueError(f"{where}: the data of the record at byte offset {offset} ({length} "
                          f"bytes) fails its CRC check; the file is corrupt")
    return ValueError(
        f"{where} is truncated: the record at byte offset {offset} says its data has "
        f"{length:,} bytes (plus a {FOOTER.size}-byte checksum), but the file has {left:,} "
        f"bytes after its header (or that length field is damaged); rewrite or drop the file"
    )


def bad_gzip(path: str, offset: int, error: Exception) -> ValueError:
    """The error for a damaged gzip stream under a TFRecord file."""
    return ValueError(
        f"TFRecord file {path!r}: its gzip data is damaged or truncated after byte {offset} "
        f"of the decompressed data ({error}); rewrite or drop the file"
    )


def read_frame(file: Any, path: str, offset: int, crc: Crc, size: int | None = None) -> bytes | None:
    """The data of the frame at the current position of ``file`` (``None`` at its end).

    Args:
        file: a binary file object positioned at the frame (plain, gzip or fsspec).
        path: the file's name for errors; ``offset``: the frame's byte offset, for errors.
        crc: :func:`crc32c`'s function.
        size: the file's size where known: a length past it is refused before reading.

    Raises:
        ValueError: from :func:`damaged` or :func:`bad_gzip`.
    """
    # Written for speed (once per record): two reads, the masking inlined.
    try:
        header = file.read(HEADER.size)
        if len(header) < HEADER.size:
            if not header:
                return None
            raise damaged(path, offset, "header", left=len(header))
        length, length_crc = HEADER.unpack(header)
        value = crc(header[:8])
        if ((value >> 15 | value << 17) + _MASK_DELTA) & 0xFFFFFFFF != length_crc:
            raise damaged(path, offset, "length")
        if size is not None and offset + OVERHEAD + length > size:
            raise damaged(path, offset, "short", length, size - offset - HEADER.size)
        body = read_bounded(file, length + FOOTER.size)
    except GZIP_ERRORS as error:
        raise bad_gzip(path, offset, error) from None
    if len(body) < length + FOOTER.size:
        raise damaged(path, offset, "short", length, len(body))
    data = body[:length]
    value = crc(data)
    if ((value >> 15 | value << 17) + _MASK_DELTA) & 0xFFFFFFFF != FOOTER.unpack_from(body, length)[0]:
        raise damaged(path, offset, "data", length)
    return data


def scan_frames(file: Any, path: str, crc: Crc, size: int | None = None,
                offset: int = 0) -> Iterator[tuple[int, int]]:
    """(byte offset, data length) of each frame from ``offset`` on, headers checked, the
    data skipped with a seek (a gzip stream seeks forward by decompressing).

    ``file`` is at the start of the next frame when a pair is yielded. ``size`` is the
    file's size where known; without it the scan ends where the file does.

    Raises:
        ValueError: the same errors as :func:`read_frame` for a damaged header or a frame
            cut short; the data's CRC is not read.
    """
    try:
        file.seek(offset)
        while size is None or offset < size:
            header = file.read(HEADER.size)
            if len(header) < HEADER.size:
                if not header and size is None:
                    return
                raise damaged(path, offset, "header", left=len(header))
            length, length_crc = HEADER.unpack(header)
            if masked_crc(header[:8], crc) != length_crc:
                raise damaged(path, offset, "length")
            end = offset + OVERHEAD + length
            # A gzip stream's seek stops at its end and says where.
            reached = file.seek(end) if size is None or end <= size else size
            if reached < end:
                raise damaged(path, offset, "short", length, reached - offset - HEADER.size)
            yield offset, length
            offset = end
    except GZIP_ERRORS as error:
        raise bad_gzip(path, offset, error) from None


def unpack_frame(buffer: bytes | memoryview, at: int, path: str, offset: int, crc: Crc) -> tuple[bytes, int]:
    """The data of the frame at ``buffer[at:]`` and where the next frame starts in ``buffer``.

    Args:
        buffer: bytes read from the file; ``at``: where the frame starts in it.
        path, offset: the file and the frame's byte offset in it, for errors.

    Raises:
        ValueError: the same errors as :func:`read_frame`.
    """
    header = bytes(buffer[at:at + HEADER.size])
    if len(header) < HEADER.size:
        raise damaged(path, offset, "header", left=len(header))
    length, length_crc = HEADER.unpack(header)
    if masked_crc(header[:8], crc) != length_crc:
        raise damaged(path, offset, "length")
    end = at + OVERHEAD + length
    if end > len(buffer):
        raise damaged(path, offset, "short", length, len(buffer) - at - HEADER.size)
    data = bytes(buffer[at + HEADER.size:end - FOOTER.size])
    if masked_crc(data, crc) != FOOTER.unpack_from(buffer, end - FOOTER.size)[0]:
        raise damaged(path, offset, "data", length)
    return data, end
