"""Grain's private TFRecord reader and iterator, as MaxText subclasses them.

MaxText imports ``_TFRecordReader`` and ``_TFRecordDatasetIterator`` from
``grain._src.python.dataset.sources.tfrecord_dataset`` to read TFRecord files from
Google Cloud Storage: its subclasses skip ``__init__`` and set ``self._reader`` to a
file object of their own (a GCS ``BlobReader``), then rely on ``next()``, ``tell()``,
``seek()`` and the state ``{"reader_offset": n}``. These classes keep that contract:
the reader reads the records of whatever file object ``self._reader`` holds.

Unlike Grain's, both CRC32C checksums of every record are checked (with granary's
:func:`~dataloader.sources.tfrecord.masked_crc`, as ``TFRecordIterDataset`` does), so a
corrupt or truncated file fails with its byte offset instead of yielding garbage, and a
record's data is read in bounded chunks
(:func:`~dataloader.sources.tfrecord.read_bounded`): a damaged length field costs the
bytes the file really holds, not the gigabytes it claims.
"""

from __future__ import annotations

import contextlib
import struct
from typing import Any

from dataloader.dataset import DatasetIterator
from dataloader.sources.tfrecord import masked_crc, read_bounded

_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")


class _TFRecordReader:
    """The records (``bytes``) of one TFRecord file object, in order.

    Args:
        path: a local file, opened here. A subclass may skip this ``__init__`` and set
            ``self._reader`` to any binary file object with ``read``, ``seek`` and
            ``tell`` (MaxText's GCS reader does).
    """

    def __init__(self, path: str) -> None:
        self._reader: Any = open(path, "rb")  # noqa: SIM115 - closed by close() or __del__

    def __iter__(self) -> _TFRecordReader:
        return self

    def __next__(self) -> bytes:
        start = self._reader.tell()
        head = self._reader.read(_LENGTH.size + _CRC.size)
        if not head:
            raise StopIteration
        if len(head) < _LENGTH.size + _CRC.size:
            raise self._corrupt(start, "ends inside a record's length")
        if masked_crc(head[: _LENGTH.size]) != _CRC.unpack_from(head, _LENGTH.size)[0]:
            raise self._corrupt(start, "has a record length that fails its CRC check")
        (length,) = _LENGTH.unpack_from(head)
        body = read_bounded(self._reader, length + _CRC.size)
        if len(body) < length + _CRC.size:
            raise self._corrupt(start, f"ends inside a record of {length} bytes",
                                f"; {len(body):,} bytes are left of the {length + _CRC.size:,} its length "
                                f"field asks for (data and checksum)")
        data = body[:length]
        if masked_crc(data) != _CRC.unpack_from(body, length)[0]:
            raise self._corrupt(start, f"has a record of {length} bytes that fails its CRC check")
        return data

    def _corrupt(self, start: int, what: str, detail: str = "") -> ValueError:
        name = getattr(self._reader, "name", self._reader)
        return ValueError(f"TFRecord file {name!r} {what} (byte offset {start}){detail}; "
                          f"the file is corrupt or not a TFRecord file")

    def seek(self, offset: int) -> None:
        self._reader.seek(offset)

    def tell(self) -> int:
        return int(self._reader.tell())

    def close(self) -> None:
        reader = getattr(self, "_reader", None)
        if reader is not None:
            reader.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


class _TFRecordDatasetIterator(DatasetIterator):
    """A ``DatasetIterator`` of one TFRecord file; its state is ``{"reader_offset": n}``.

    A subclass may skip this ``__init__`` (calling ``DatasetIterator.__init__(self)``)
    and set ``self._reader`` to a reader of its own, as MaxText's GCS iterator does.
    """

    stats_name = "read"  # stats(): reading the file is the stream's read stage

    def __init__(self, path: str) -> None:
        super().__init__()
        self._reader = _TFRecordReader(path)

    def __next__(self) -> bytes:
        return next(self._reader)

    def get_state(self) -> dict[str, int]:
        return {"reader_offset": self._reader.tell()}

    def set_state(self, state: dict[str, int]) -> None:
        if not isinstance(state, dict) or not isinstance(state.get("reader_offset"), int):
            raise ValueError(f"a TFRecord iterator's state is {{'reader_offset': int}}, got {state!r}; "
                             f"pass a state from this iterator's get_state()")
        self._reader.seek(state["reader_offset"])

    def close(self) -> None:
        reader = getattr(self, "_reader", None)
        if reader is not None:
            reader.close()
        super().close()
