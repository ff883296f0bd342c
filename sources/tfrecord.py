"""TFRecord files, read and written without TensorFlow, every checksum checked.

A TFRecord file is a plain sequence of records, each laid out as::

    uint64  length of the data, little-endian
    uint32  masked CRC32C of those 8 length bytes
    bytes   the data (length bytes)
    uint32  masked CRC32C of the data

A masked CRC is ``((crc >> 15) | (crc << 17)) + 0xA282EAD8`` modulo ``2**32``
(TensorFlow's ``crc32c::Mask``). There is no index, so a file is read in order, and
a reader's position is one integer: the byte offset of the next record. A stream
resumes from it with one ``seek``.

Both checksums of every record are checked. A bad checksum, or a file that ends
inside a record, raises ``ValueError`` naming the file and the byte offset of the
record, so a corrupt or truncated shard is found, never silently read as garbage.
A record's length is checked against the bytes left in the file before its data is
read, and data is read in chunks of at most ``_CHUNK_BYTES`` (:func:`read_bounded`),
so a damaged length field (a 44-byte file that claims a record of 2**60 bytes) costs
what the file holds, never the claimed size.

A file whose name ends in ``.gz`` (``data.tfrecord.gz``, as TensorFlow writes with
``compression_type="GZIP"``) is read through the standard library's ``gzip``, streaming;
its offsets count bytes of the decompressed data, and a ``seek`` decompresses from the
start of the file to the offset (a restore costs one pass over that part of the file).

The CRC32C comes from ``google-crc32c`` (Google's C library, using the CPU's CRC
instruction where there is one; about 0.4 us for a 1 KB record). It is an optional
extra, ``pip install 'granary[tfrecord]'``, imported only by this module.

Example:
    >>> write_tfrecord("/tmp/three.tfrecord", [b"a", b"bb", b"ccc"])
    3
    >>> with TFRecordReader("/tmp/three.tfrecord") as reader:
    ...     [reader.read(), reader.offset, reader.read(), reader.read(), reader.read()]
    [b'a', 17, b'bb', b'ccc', None]
"""

from __future__ import annotations

import contextlib
import gzip
import os
import struct
import zlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from .array_record_writer import _as_bytes, _staging_path
from .files.metadata_index import FileStat, pack_ints, resolve, stat_local, unpack_ints

_HEADER = struct.Struct("<QI")  # length, masked CRC of the length
_FOOTER = struct.Struct("<I")  # masked CRC of the data
_MASK_DELTA = 0xA282EAD8
_GZIP_ERRORS = (gzip.BadGzipFile, EOFError, zlib.error)
# Read in large blocks: records are often small, and each read() is a system call.
_BUFFER_BYTES = 1 << 20
# The most one read() asks for: Python's read(n) allocates n bytes before reading, so a
# length field is never passed to it whole (see read_bounded).
_CHUNK_BYTES = 1 << 24


def read_bounded(file: Any, size: int) -> bytes:
    """``size`` bytes of ``file``, or fewer if it ends first, read in bounded chunks.

    ``file.read(n)`` allocates ``n`` bytes up front, so reading a length taken from a
    damaged file in one call can ask for gigabytes (or fail with ``OverflowError``)
    before finding that the file is short. Here memory grows only with the bytes that
    are really there.
    """
    if size <= _CHUNK_BYTES:
        return bytes(file.read(size))
    parts, left = [], size
    while left:
        part = file.read(min(left, _CHUNK_BYTES))
        if not part:
            break
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def _crc32c() -> Callable[[bytes], int]:
    try:
        import google_crc32c
    except ImportError:
        raise ImportError(
            "reading and writing TFRecord files checks CRC32C checksums with the "
            "google-crc32c package; install it: pip install 'granary[tfrecord]' "
            "(or pip install google-crc32c)"
        ) from None
    return google_crc32c.value


def masked_crc(data: bytes, crc32c: Callable[[bytes], int] | None = None) -> int:
    """The masked CRC32C of ``data``, as TFRecord stores it."""
    crc = (crc32c or _crc32c())(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


class TFRecordReader:
    """Reads the records of one TFRecord file in order, from a byte offset.

    Args:
        path: the file; read through gzip when its name ends in ``.gz``.
        offset: the byte offset of the record to start at (a value of ``offset`` read
            earlier; 0 is the first record).

    Attributes:
        size: the file's size in bytes; ``None`` for a gzip file (its data's size is
            known only once it has all been decompressed).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: ``offset`` is outside the file.
    """

    def __init__(self, path: str | os.PathLike, offset: int = 0) -> None:
        self.path = os.fspath(path)
        self._crc32c = _crc32c()
        self._file: Any
        self.size: int | None
        if "://" in self.path:  # a URL: through fsspec (sources.remote.urls)
            from .remote.urls import open_path

            self._file = open_path(self.path)
            self.size = getattr(self._file, "size", None)
        else:
            self._file = open(self.path, "rb", buffering=_BUFFER_BYTES)  # noqa: SIM115 - closed by close()
            self.size = os.fstat(self._file.fileno()).st_size
        if self.path.lower().endswith(".gz"):
            self._file = gzip.GzipFile(fileobj=self._file, mode="rb")  # closes with the raw file below
            self.size = None
        self.offset = 0
        try:
            self.seek(offset)
        except BaseException:
            self.close()
            raise

    def seek(self, offset: int) -> None:
        """Continues with the record at byte ``offset``."""
        limit = self.size if self.size is not None else offset
        if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset <= limit:
            raise self._outside(offset)
        # A gzip stream's seek decompresses up to the offset, and stops at its end.
        try:
            reached = self._file.seek(offset)
        except _GZIP_ERRORS as error:
            raise self._bad_gzip(error) from None
        if reached != offset:
            self._file.seek(self.offset)  # back where the reader was
            raise self._outside(offset)
        self.offset = offset

    def _outside(self, offset: object) -> ValueError:
        size = "gzip" if self.size is None else f"{self.size} bytes"
        return ValueError(
            f"offset {offset!r} is outside TFRecord file {self.path!r} ({size}); "
            f"pass an offset read from this file's reader"
        )

    def read(self) -> bytes | None:
        """The next record's data, or ``None`` at the end of the file.

        Raises:
            ValueError: a checksum does not match, or the file ends inside the record.
        """
        # Written for speed (it runs once per record): two reads, the masking inlined.
        start, crc32c = self.offset, self._crc32c
        try:
            header = self._file.read(_HEADER.size)
        except _GZIP_ERRORS as error:
            raise self._bad_gzip(error) from None
        if len(header) < _HEADER.size:
            if not header:
                return None
            raise self._truncated(start, _HEADER.size, len(header))
        length, length_crc = _HEADER.unpack(header)
        crc = crc32c(header[:8])
        if ((crc >> 15 | crc << 17) + _MASK_DELTA) & 0xFFFFFFFF != length_crc:
            raise ValueError(
                f"TFRecord file {self.path!r}: the length of the record at byte offset {start} "
                f"fails its CRC check; the file is corrupt or not a TFRecord file"
            )
        if self.size is not None and start + _HEADER.size + length + _FOOTER.size > self.size:
            self.size = os.fstat(self._file.fileno()).st_size  # the file may have grown
            if start + _HEADER.size + length + _FOOTER.size > self.size:
                raise self._too_long(start, length, self.size - start - _HEADER.size)
        try:
            body = read_bounded(self._file, length + _FOOTER.size)
        except _GZIP_ERRORS as error:
            raise self._bad_gzip(error) from None
        if len(body) < length + _FOOTER.size:
            raise self._too_long(start, length, len(body))
        data = body[:length]
        crc = crc32c(data)
        if ((crc >> 15 | crc << 17) + _MASK_DELTA) & 0xFFFFFFFF != _FOOTER.unpack_from(body, length)[0]:
            raise ValueError(
                f"TFRecord file {self.path!r}: the data of the record at byte offset {start} "
                f"({length} bytes) fails its CRC check; the file is corrupt"
            )
        self.offset = start + _HEADER.size + length + _FOOTER.size
        return data

    def _bad_gzip(self, error: Exception) -> ValueError:
        return ValueError(
            f"TFRecord file {self.path!r}: its gzip data is damaged or truncated after byte "
            f"{self.offset} of the decompressed data ({error}); rewrite or drop the file"
        )

    def _truncated(self, start: int, needed: int, found: int) -> ValueError:
        return ValueError(
            f"TFRecord file {self.path!r} is truncated: the record at byte offset {start} needs "
            f"{needed} bytes but the file ends after {found}; rewrite or drop the file"
        )

    def _too_long(self, start: int, length: int, left: int) -> ValueError:
        return ValueError(
            f"TFRecord file {self.path!r} is truncated: the record at byte offset {start} says "
            f"its data has {length:,} bytes (plus a {_FOOTER.size}-byte checksum), but the file "
            f"has {left:,} bytes after its header (or that length field is damaged); rewrite "
            f"or drop the file"
        )

    def check_first_record(self) -> None:
        """Checks the first record's length checksum (a cheap test that this is TFRecord)."""
        offset = self.offset
        try:
            self.seek(0)
            try:
                header = self._file.read(_HEADER.size)
            except _GZIP_ERRORS as error:
                raise self._bad_gzip(error) from None
            if header and len(header) < _HEADER.size:
                raise self._truncated(0, _HEADER.size, len(header))
            if header and masked_crc(header[:8], self._crc32c) != _HEADER.unpack(header)[1]:
                raise ValueError(
                    f"{self.path!r} is not a TFRecord file: its first record's length fails "
                    f"its CRC check"
                )
        finally:
            self.seek(offset)

    def __iter__(self) -> TFRecordReader:
        return self

    def __next__(self) -> bytes:
        data = self.read()
        if data is None:
            raise StopIteration
        return data

    def close(self) -> None:
        """Closes the file; idempotent."""
        raw = getattr(self._file, "fileobj", None)  # a GzipFile leaves its file open
        self._file.close()
        if raw is not None:
            raw.close()

    @property
    def closed(self) -> bool:
        return bool(self._file.closed)

    def __enter__(self) -> TFRecordReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def scan_record_starts(path: str) -> tuple[np.ndarray, bool]:
    """Where each record of the local TFRecord file ``path`` starts, from its 12-byte
    headers alone (each length checked against its CRC, the data skipped with a seek),
    then where the last good one ends; and whether a damaged frame follows the good
    records there (a header whose CRC fails, or a length past the end of the file)."""
    crc32c = _crc32c()
    size = os.path.getsize(path)
    starts, offset, damaged = [], 0, False
    with open(path, "rb") as file:
        while True:
            header = file.read(_HEADER.size)
            if not header:
                break
            length = int.from_bytes(header[:8], "little")
            end = offset + _HEADER.size + length + _FOOTER.size
            if (len(header) < _HEADER.size or end > size
                    or masked_crc(header[:8], crc32c) != int.from_bytes(header[8:], "little")):
                damaged = True
                break
            starts.append(offset)
            offset = end
            file.seek(offset)
    starts.append(offset)
    return np.asarray(starts, dtype=np.int64), damaged


def record_starts(paths: Sequence[str], index: Any = None) -> list[tuple[np.ndarray, bool]]:
    """:func:`scan_record_starts` of each file, through the metadata index (``index``: None
    for the index beside the data, if any; see :mod:`.files.metadata_index`).

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


def write_tfrecord(path: str | os.PathLike, records: Iterable[bytes]) -> int:
    """Writes ``records`` to a TFRecord file (as TensorFlow would) and returns how many.

    The records go to a temporary file in the same directory, renamed to ``path``
    once complete, so a failure never leaves a half-written file under ``path``;
    missing folders on the way to it are created.

    Raises:
        TypeError: a record is not bytes-like; the message names its position.
        OSError: the folder of ``path`` cannot be created.
    """
    path = os.fspath(path)
    crc32c = _crc32c()
    temp_path = _staging_path(path)
    count = 0
    try:
        with open(temp_path, "wb", buffering=_BUFFER_BYTES) as out:
            for record in records:
                data = _as_bytes(record, count)
                length = struct.pack("<Q", len(data))
                out.write(length + _FOOTER.pack(masked_crc(length, crc32c)))
                out.write(data)
                out.write(_FOOTER.pack(masked_crc(data, crc32c)))
                count += 1
        os.replace(temp_path, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temp_path)
        raise
    return count

