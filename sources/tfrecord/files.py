"""The TFRecord file reader and writer over the one frame codec (:mod:`.frames`).

A reader's position is one integer: the byte offset of the next record, so a stream
resumes from it with one ``seek``. A file whose name ends in ``.gz`` (``data.tfrecord.gz``,
as TensorFlow writes with ``compression_type="GZIP"``) is read through the standard
library's ``gzip``, streaming; its offsets count bytes of the decompressed data, and a
``seek`` decompresses from the start of the file to the offset (a restore costs one pass
over that part of the file).

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
from collections.abc import Iterable
from typing import Any

from ..array_record_writer import _as_bytes, _staging_path
from .frames import (
    GZIP_ERRORS,
    HEADER,
    OVERHEAD,
    bad_gzip,
    crc32c,
    damaged,
    frame,
    masked_crc,
    read_frame,
)

# Read in large blocks: records are often small, and each read() is a system call.
_BUFFER_BYTES = 1 << 20


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
        self._crc32c = crc32c()
        self._file: Any
        self.size: int | None
        if "://" in self.path:  # a URL: through fsspec (sources.remote.urls)
            from ..remote.urls import open_path

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
        except GZIP_ERRORS as error:
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
            ValueError: a checksum does not match, or the file ends inside the record
                (:func:`.frames.damaged` says which, with the file and byte offset).
        """
        start = self.offset
        try:
            data = read_frame(self._file, self.path, start, self._crc32c, self.size)
        except ValueError:
            if not self._grew():
                raise
            self._file.seek(start)  # the writer was still writing: read the frame again
            data = read_frame(self._file, self.path, start, self._crc32c, self.size)
        if data is not None:
            self.offset = start + OVERHEAD + len(data)
        return data

    def _grew(self) -> bool:
        """Whether a local file grew since its size was read (then ``size`` is updated)."""
        if self.size is None or "://" in self.path:
            return False
        size = os.fstat(self._file.fileno()).st_size
        grew, self.size = size > self.size, size
        return grew

    def _bad_gzip(self, error: Exception) -> ValueError:
        return bad_gzip(self.path, self.offset, error)

    def check_first_record(self) -> None:
        """Checks the first record's length checksum (a cheap test that this is TFRecord)."""
        offset = self.offset
        try:
            self.seek(0)
            try:
                header = self._file.read(HEADER.size)
            except GZIP_ERRORS as error:
                raise self._bad_gzip(error) from None
            if header and len(header) < HEADER.size:
                raise damaged(self.path, 0, "header", left=len(header))
            if header and masked_crc(header[:8], self._crc32c) != HEADER.unpack(header)[1]:
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
    crc = crc32c()
    temp_path = _staging_path(path)
    count = 0
    try:
        with open(temp_path, "wb", buffering=_BUFFER_BYTES) as out:
            for record in records:
                data = _as_bytes(record, count)
                head, foot = frame(data, crc)
                out.write(head)
                out.write(data)
                out.write(foot)
                count += 1
        os.replace(temp_path, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temp_path)
        raise
    return count

