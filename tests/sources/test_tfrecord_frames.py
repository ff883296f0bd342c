"""One TFRecord frame codec: every reader of granary refuses a damaged frame with the same
error, naming the file and the record's byte offset (sources/tfrecord/frames.py)."""

from __future__ import annotations

import numpy as np
import pytest

from dataloader.beam import tfrecord as beam_tfrecord
from dataloader.compat.tfrecord import _TFRecordReader
from dataloader.dataset.streams import TFRecordIterDataset
from dataloader.dataset.streams.tfrecord_source import TFRecordStreamSource, record_offsets
from dataloader.sources import TFRecordReader, write_tfrecord
from dataloader.sources.tfrecord.frames import crc32c, frame, read_frame, unpack_frame
from tests.sources.test_tfrecord import MORRIS, MORRIS_FILE


def _reader(path: str) -> list[bytes]:
    with TFRecordReader(path) as reader:
        return list(reader)


def _stream(path: str) -> list[bytes]:
    return list(TFRecordIterDataset(path))


def _workers_source(path: str) -> list[bytes]:
    """The random-access source the dataset API's workers read a TFRecord stream with."""
    source = TFRecordStreamSource([path], [record_offsets(path)], cycle_length=1)
    try:
        return source.__getitems__(np.arange(len(source)))
    finally:
        source.close()


def _compat(path: str) -> list[bytes]:
    reader = _TFRecordReader(path)
    try:
        return list(reader)
    finally:
        reader.close()


def _converter(path: str) -> list[bytes]:
    return list(beam_tfrecord.read(path))


READERS = [_reader, _stream, _workers_source, _compat, _converter]

# (name, damage): each leaves the first four records whole and damages the fifth, which
# starts at byte offset 78; the expected message names that offset.
DAMAGES = {
    "data": (lambda b: b[:-6] + bytes([b[-6] ^ 0xFF]) + b[-5:],
             r"the data of the record at byte offset 78 \(11 bytes\) fails its CRC check"),
    "length": (lambda b: b[:79] + bytes([b[79] ^ 0x01]) + b[80:],
               r"the length of the record at byte offset 78 fails its CRC check"),
    "cut": (lambda b: b[:-3],
            r"is truncated: the record at byte offset 78 says its data has 11 bytes"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_every_reader_refuses_a_damaged_frame_with_the_same_error(tmp_path, damage):
    cut, message = DAMAGES[damage]
    path = tmp_path / f"{damage}.tfrecord"
    path.write_bytes(cut(MORRIS_FILE))
    errors = {}
    for read in READERS:
        with pytest.raises(ValueError, match=rf"TFRecord file '.*{damage}\.tfrecord'.* {message}") as error:
            read(str(path))
        errors[read.__name__] = str(error.value)
    assert len(set(errors.values())) == 1, errors


def test_every_reader_reads_the_file_tensorflow_wrote(tmp_path):
    path = tmp_path / "morris.tfrecord"
    path.write_bytes(MORRIS_FILE)
    for read in READERS:
        assert read(str(path)) == MORRIS, read.__name__


def test_a_frame_written_is_the_frame_read_from_a_file_and_from_memory(tmp_path):
    crc = crc32c()
    head, foot = frame(b"1 1", crc)
    assert head + b"1 1" + foot == MORRIS_FILE[17:36]  # TensorFlow's second record
    write_tfrecord(tmp_path / "m.tfrecord", MORRIS)
    with open(tmp_path / "m.tfrecord", "rb") as file:
        file.seek(17)
        assert read_frame(file, "m", 17, crc) == b"1 1"
    assert unpack_frame(MORRIS_FILE, 17, "m", 17, crc) == (b"1 1", 36)
