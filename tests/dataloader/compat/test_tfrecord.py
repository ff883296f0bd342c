"""Grain's private ``_TFRecordReader`` / ``_TFRecordDatasetIterator``, as MaxText uses them."""

from __future__ import annotations

import io
import struct
import tracemalloc

import pytest

import dataloader as dl
from dataloader.compat.tfrecord import _TFRecordDatasetIterator, _TFRecordReader
from dataloader.sources.tfrecord import masked_crc

RECORDS = [b"a", b"bb", b"", b"dddd" * 100]


@pytest.fixture
def path(tmp_path):
    file = tmp_path / "four.tfrecord"
    dl.write_tfrecord(file, RECORDS)
    return str(file)


def test_the_reader_yields_every_record_then_stops(path):
    reader = _TFRecordReader(path)
    assert list(reader) == RECORDS
    with pytest.raises(StopIteration):
        next(reader)
    reader.close()


def test_tell_and_seek_resume_at_a_record(path):
    reader = _TFRecordReader(path)
    next(reader)
    offset = reader.tell()
    assert offset == 8 + 4 + 1 + 4
    rest = list(reader)
    reader.seek(offset)
    assert list(reader) == rest == RECORDS[1:]


def test_the_iterator_state_is_graines_reader_offset_and_restores(path):
    it = _TFRecordDatasetIterator(path)
    assert next(it) == b"a"
    state = it.get_state()
    assert state == {"reader_offset": 17}
    rest = list(it)
    again = _TFRecordDatasetIterator(path)
    again.set_state(state)
    assert list(again) == rest == RECORDS[1:]
    with pytest.raises(ValueError, match=r"state is \{'reader_offset': int\}, got \{'offset': 3\}"):
        again.set_state({"offset": 3})


def test_maxtexts_subclasses_read_from_a_file_object_of_their_own(path):
    """MaxText's GCS reader skips __init__ and sets self._reader to a BlobReader."""
    with open(path, "rb") as f:
        content = f.read()

    class BlobTFRecordReader(_TFRecordReader):
        def __init__(self, path: str) -> None:
            self._reader = io.BytesIO(content)

    class BlobIterator(_TFRecordDatasetIterator):
        def __init__(self, path: str) -> None:
            dl.DatasetIterator.__init__(self)
            self._reader = BlobTFRecordReader(path)

    it = BlobIterator("gs://bucket/four.tfrecord")
    assert next(it) == b"a"
    state = it.get_state()
    assert list(it) == RECORDS[1:]
    it.set_state(state)
    assert next(it) == b"bb"


def test_a_corrupt_record_fails_naming_the_file_and_offset(path):
    with open(path, "rb") as f:
        content = bytearray(f.read())
    content[17 + 12] ^= 0xFF  # the first byte of the second record's data
    reader = _TFRecordReader(path)
    reader._reader = io.BytesIO(bytes(content))
    assert next(reader) == b"a"
    with pytest.raises(ValueError, match=r"the data of the record at byte offset 17 \(2 bytes\) fails its CRC check"):
        next(reader)


def test_a_truncated_file_fails_naming_the_file_and_offset(tmp_path, path):
    with open(path, "rb") as f:
        content = f.read()
    cut = tmp_path / "cut.tfrecord"
    cut.write_bytes(content[:-3])
    with pytest.raises(ValueError, match=r"cut\.tfrecord' is truncated: the record at byte offset 51 says its data has 400 bytes"):
        list(_TFRecordReader(str(cut)))


@pytest.mark.parametrize("length", [1 << 30, 2**64 - 1])
def test_a_length_field_past_the_end_is_refused_without_allocating_it(tmp_path, length):
    """A header that passes its CRC but claims a gigabyte: the reader reads what is there
    (in bounded chunks, through any file object) and names the file, offset and lengths."""
    raw = struct.pack("<Q", length)
    (tmp_path / "forged.tfrecord").write_bytes(raw + struct.pack("<I", masked_crc(raw)) + b"x" * 32)
    reader = _TFRecordReader(str(tmp_path / "forged.tfrecord"))
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=rf"forged\.tfrecord' is truncated: the record at byte offset 0 says its data "
                                             rf"has {length:,} bytes .* the file has 32 bytes after its header"):
            next(reader)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        reader.close()
    assert peak < 40 << 20, peak  # one bounded read (16 MiB), not the gigabyte
