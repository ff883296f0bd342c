"""Grain's private TFRecord reader and iterator, as MaxText subclasses them.

MaxText imports ``_TFRecordReader`` and ``_TFRecordDatasetIterator`` from
``grain._src.python.dataset.sources.tfrecord_dataset`` to read TFRecord files from
Google Cloud Storage: its subclasses skip ``__init__`` and set ``self._reader`` to a
file object of their own (a GCS ``BlobReader``), then rely on ``next()``, ``tell()``,
``seek()`` and the state ``{"reader_offset": n}``. These classes keep that contract:
the reader reads the records of whatever file object ``self._reader`` holds.

Unlike Grain's, both CRC32C checksums of every record are checked: frames are read by
granary's one frame codec (:mod:`dataloader.sources.tfrecord.frames`), as every other
TFRecord reader of granary reads them, so a corrupt or truncated file fails with the
same error, naming its byte offset, instead of yielding garbage, and a record's data is
read in bounded chunks: a damaged length field costs the bytes the file really holds,
not the gigabytes it claims.
"""

from __future__ import annotations

import contextlib
from typing import Any

from dataloader.dataset import DatasetIterator
from dataloader.sources.tfrecord.frames import crc32c, read_frame


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
        name = getattr(self._reader, "name", self._reader)  # a GCS reader may have none
        data = read_frame(self._reader, str(name), self._reader.tell(), crc32c())
        if data is None:
            raise StopIteration
        return data

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
