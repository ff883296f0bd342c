"""Grain's ``TFRecordIterDataset``: the records of TFRecord files, read in order.

Read without TensorFlow by :class:`~dataloader.sources.TFRecordReader`, both CRC32C
checksums of every record checked (Grain checks neither): a corrupt or truncated file
fails with an error naming the file and the record's byte offset. Records are ``bytes``
(parse ``tf.train.Example`` protos in a ``map``). The state of one file is
``{"path", "reader_offset"}`` (Grain's field, plus the file's base name): a restore is
one ``seek``.

Calls chained on it (``map``, ``filter``, ``flat_map``, ``random_map``, ``batch``) run
on the engine, in worker processes under ``mp_prefetch``, over
:class:`~dataloader.dataset.streams.tfrecord_source.TFRecordStreamSource` (an index of
record offsets read from the frame headers); a stream with a gzip file, a remote path
or a subclass that reads its files its own way runs them at the iterator level.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from dataloader.dataset.base import DatasetIterator
from dataloader.dataset.streams.files import CYCLE_LENGTH, FileIterDataset, check_file_state
from dataloader.sources import TFRecordReader
from dataloader.sources.files.metadata_index import check_index_arg

if TYPE_CHECKING:
    from dataloader.dataset.streams.lowering import StreamForm


class TFRecordIterDataset(FileIterDataset):
    """The records (``bytes``) of one or more TFRecord files, in order.

    Needs the ``google-crc32c`` package (``pip install 'granary[tfrecord]'``).

    Args:
        path: a path, a glob pattern (files sorted), or a list of those. Grain takes
            one path; several files are interleaved as ``ParquetIterDataset`` does.
        index: where the record offsets of the files are kept when the stream runs on
            the engine (:mod:`dataloader.sources.files.metadata_index`; None: the index beside
            the data, if any). Not in Grain.

    Raises:
        FileNotFoundError: a path does not exist or a glob matches nothing.
        ValueError: a file does not start with a valid TFRecord record.
        ImportError: ``google-crc32c`` is not installed.

    Example:
        >>> import dataloader as dl
        >>> dl.write_tfrecord("/tmp/ab.tfrecord", [b"a", b"b"])
        2
        >>> list(dl.experimental.TFRecordIterDataset("/tmp/ab.tfrecord"))
        [b'a', b'b']
    """

    def __init__(self, path: Any, *, index: Any = None) -> None:
        # A URL (gs://, s3://, ...) is taken as given, not globbed or opened here: code
        # written for Grain subclasses this class to read such files its own way
        # (MaxText's GCS reader overrides __iter__ and reads ``self._path``).
        remote = isinstance(path, str) and "://" in path
        super().__init__(path, what="TFRecord", example_glob="*.tfrecord", local=not remote)
        # Grain's attribute: the path as given (a subclass's __iter__ reads it).
        self._path = os.fspath(path) if isinstance(path, (str, os.PathLike)) else self._paths[0]
        self._remote = remote
        self._index = check_index_arg(index)
        if remote:
            return
        for file in self._paths:  # fail here, not in the middle of an epoch
            with TFRecordReader(file) as reader:
                reader.check_first_record()

    def _file_iterator(self, path: str) -> DatasetIterator:
        return TFRecordFileIterator(path)

    def _stream_form(self) -> StreamForm | None:
        """This stream as random access over its order: a source over the record offsets
        of its files, indexed here (None for gzip or remote files, and for a subclass
        that reads its files its own way)."""
        if not self._seekable():
            return None
        return stream_source_form(self._paths, CYCLE_LENGTH, self._index)

    def _seekable(self) -> bool:
        """Whether its files are read by this class from local, uncompressed files, so a
        record can be read from its offset."""
        cls = type(self)
        if cls.__iter__ is not FileIterDataset.__iter__ or cls._file_iterator is not TFRecordIterDataset._file_iterator:
            return False
        # A gzip file is read from its start: it has no offset to jump to.
        return not getattr(self, "_remote", False) and not any(p.lower().endswith(".gz") for p in self._paths)


def stream_source_form(paths: list[str], cycle_length: int, index: Any = None) -> StreamForm:
    """The files ``paths`` interleaved ``cycle_length`` at a time, as random access (the
    record offsets through the metadata index ``index``, see ``dl.JsonlDataSource``)."""
    from dataloader.dataset.streams.lowering import StreamForm, _source_dataset
    from dataloader.dataset.streams.tfrecord_source import TFRecordStreamSource, record_offsets_of

    source = TFRecordStreamSource(paths, record_offsets_of(paths, index), cycle_length)
    return StreamForm(_source_dataset(source), source.position_of_state)


class TFRecordFileIterator(DatasetIterator):
    """The records of one TFRecord file; its state is the next record's byte offset."""

    stats_name = "read"  # stats(): reading the file is the stream's read stage

    def __init__(self, path: str) -> None:
        super().__init__()
        self._path = path
        self._reader = TFRecordReader(path)

    def __next__(self) -> bytes:
        if self._closed:
            raise ValueError(f"next() on a closed iterator ({self!r}); make a new one")
        data = self._reader.read()
        if data is None:
            raise StopIteration
        return data

    def get_state(self) -> dict[str, Any]:
        return {"path": os.path.basename(self._path), "reader_offset": self._reader.offset}

    def set_state(self, state: dict[str, Any]) -> None:
        state = check_file_state(state, self._path, ("reader_offset",), "a TFRecord file")
        self._reader.seek(int(state["reader_offset"]))

    def close(self) -> None:
        self._reader.close()
        super().close()

    def __repr__(self) -> str:
        return f"TFRecordFileIterator({self._path!r})"
