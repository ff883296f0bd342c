"""TFRecord files, read and written without TensorFlow, every checksum checked.

:mod:`.frames` is the one frame codec (the layout, the masked CRC32C, the checks and the
errors); :mod:`.files` holds the file reader and writer over it, :mod:`.index` where a
file's records start (for random access, kept in the metadata index). Every other TFRecord
reader of granary (the dataset API's stream and its workers' source, Grain's
compatibility reader, the converter) reads frames through :mod:`.frames` too, so a
damaged file is refused with the same error, naming the file and the byte offset,
whichever reads it.

Both checksums of every record are checked. A bad checksum, or a file that ends inside
a record, raises ``ValueError`` naming the file and the byte offset of the record, so a
corrupt or truncated shard is found, never silently read as garbage.
"""

from __future__ import annotations

from . import index as index  # dataloader.sources.tfrecord.index, for the index command
from .files import TFRecordReader, write_tfrecord
from .frames import masked_crc, read_bounded

__all__ = ["TFRecordReader", "masked_crc", "read_bounded", "write_tfrecord"]
