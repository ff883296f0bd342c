"""TFRecord without TensorFlow: byte-exact with TensorFlow's writer, every CRC checked,
corruption and truncation named by file and byte offset, positions resumable."""

from __future__ import annotations

import gzip
import os
import struct
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dataloader.sources import TFRecordReader, write_tfrecord
from dataloader.sources.tfrecord import masked_crc
from tests.helpers import open_files_under

MORRIS = [b"1", b"1 1", b"2 1", b"1 2 1 1", b"1 1 1 2 2 1"]
# Grain's test file morris_sequence_first_5.tfrecord, written by TensorFlow's
# tf.io.TFRecordWriter: the records above, byte for byte.
MORRIS_FILE = bytes.fromhex(
    "0100000000000000 0175de41 31 c30c4ad6"
    " 0300000000000000 b099490e 312031 59bed8de"
    " 0300000000000000 b099490e 322031 b4f2345f"
    " 0700000000000000 bbd79f11 31203220312031 9886ebb8"
    " 0b00000000000000 8615f504 3120312031203220322031 61692698".replace(" ", "")
)


def test_the_crc_is_crc32c_masked_as_tensorflow_masks_it():
    import google_crc32c

    assert google_crc32c.value(b"123456789") == 0xE3069283  # the CRC-32C check value
    crc = 0xE3069283
    assert masked_crc(b"123456789") == ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) % 2**32


def test_the_writer_matches_tensorflow_byte_for_byte(tmp_path):
    assert write_tfrecord(tmp_path / "m.tfrecord", MORRIS) == 5
    assert (tmp_path / "m.tfrecord").read_bytes() == MORRIS_FILE


def test_the_writer_creates_missing_folders(tmp_path):
    path = tmp_path / "data" / "part-0.tfrecord"
    assert write_tfrecord(path, MORRIS) == 5
    assert path.read_bytes() == MORRIS_FILE
    assert sorted(p.name for p in path.parent.iterdir()) == ["part-0.tfrecord"]


def test_a_file_tensorflow_wrote_reads_back(tmp_path):
    (tmp_path / "m.tfrecord").write_bytes(MORRIS_FILE)
    with TFRecordReader(tmp_path / "m.tfrecord") as reader:
        assert list(reader) == MORRIS
        assert reader.offset == len(MORRIS_FILE)


def test_the_offset_of_a_record_resumes_there(tmp_path):
    write_tfrecord(tmp_path / "r.tfrecord", [b"%d" % i * i for i in range(20)])
    with TFRecordReader(tmp_path / "r.tfrecord") as reader:
        offsets = []
        for _ in range(20):
            offsets.append(reader.offset)
            reader.read()
        assert reader.read() is None
    for i, offset in enumerate(offsets):
        with TFRecordReader(tmp_path / "r.tfrecord", offset) as reader:
            assert list(reader) == [b"%d" % k * k for k in range(i, 20)]


def test_an_empty_file_has_no_records_and_empty_records_are_kept(tmp_path):
    (tmp_path / "e.tfrecord").write_bytes(b"")
    with TFRecordReader(tmp_path / "e.tfrecord") as reader:
        assert list(reader) == []
    write_tfrecord(tmp_path / "z.tfrecord", [b"", b"x", b""])
    with TFRecordReader(tmp_path / "z.tfrecord") as reader:
        assert list(reader) == [b"", b"x", b""]


def test_a_corrupt_data_byte_is_named_by_file_and_offset(tmp_path):
    data = bytearray(MORRIS_FILE)
    data[12 + 1 + 4 + 12 + 1] ^= 0x01  # the second record's data ("1 1" -> "1!1")
    (tmp_path / "bad.tfrecord").write_bytes(bytes(data))
    with TFRecordReader(tmp_path / "bad.tfrecord") as reader:
        assert reader.read() == b"1"
        with pytest.raises(ValueError, match=r"bad\.tfrecord'.* record at byte offset 17 \(3 bytes\) fails its CRC"):
            reader.read()


def test_a_corrupt_length_is_named_by_file_and_offset(tmp_path):
    data = bytearray(MORRIS_FILE)
    data[17] = 0x7F  # the second record's length
    (tmp_path / "len.tfrecord").write_bytes(bytes(data))
    with TFRecordReader(tmp_path / "len.tfrecord") as reader:
        reader.read()
        with pytest.raises(ValueError, match=r"length of the record at byte offset 17 fails its CRC"):
            reader.read()


@pytest.mark.parametrize("cut", [5, 12 + 1, 12 + 1 + 2])
def test_a_truncated_file_is_named_by_file_and_offset(tmp_path, cut):
    (tmp_path / "cut.tfrecord").write_bytes(MORRIS_FILE[: 17 + cut])
    with TFRecordReader(tmp_path / "cut.tfrecord") as reader:
        assert reader.read() == b"1"
        with pytest.raises(ValueError, match=rf"cut\.tfrecord' is truncated: the record at byte offset 17 (needs .* ends after {cut}|says its data has 3 bytes .* has {cut - 12} bytes after its header)"):
            reader.read()


def test_a_file_that_is_not_tfrecord_fails_the_first_record_check(tmp_path):
    (tmp_path / "text.tfrecord").write_bytes(b"hello, this is not a TFRecord file")
    with TFRecordReader(tmp_path / "text.tfrecord") as reader, pytest.raises(ValueError, match="is not a TFRecord file"):
        reader.check_first_record()
    (tmp_path / "one.tfrecord").write_bytes(b"1")
    with TFRecordReader(tmp_path / "one.tfrecord") as reader, pytest.raises(ValueError, match="is truncated"):
        reader.check_first_record()


def test_an_offset_outside_the_file_is_refused_and_closes_the_file(tmp_path):
    write_tfrecord(tmp_path / "r.tfrecord", [b"abc"])
    with pytest.raises(ValueError, match=r"offset 100 is outside TFRecord file .* \(19 bytes\)"):
        TFRecordReader(tmp_path / "r.tfrecord", 100)
    assert not open_files_under(tmp_path)


def test_a_record_that_is_not_bytes_leaves_no_file(tmp_path):
    with pytest.raises(TypeError, match=r"record 1 is str, expected bytes .* text\.encode\(\)"):
        write_tfrecord(tmp_path / "s.tfrecord", [b"ok", "text"])
    assert os.listdir(tmp_path) == []


def test_close_releases_the_file(tmp_path):
    write_tfrecord(tmp_path / "r.tfrecord", [b"abc"])
    reader = TFRecordReader(tmp_path / "r.tfrecord")
    assert open_files_under(tmp_path)
    reader.close()
    reader.close()
    assert reader.closed and not open_files_under(tmp_path)



# ``NAME.tfrecord.gz``: TensorFlow's compression_type="GZIP", read through gzip.


def _gzip_file(path, data: bytes):
    with gzip.open(path, "wb") as f:
        f.write(data)
    return path


def test_a_gzipped_file_reads_and_resumes_by_decompressed_offset(tmp_path):
    records = [b"%d" % i * i for i in range(20)]
    write_tfrecord(tmp_path / "r.tfrecord", records)
    path = _gzip_file(tmp_path / "r.tfrecord.gz", (tmp_path / "r.tfrecord").read_bytes())
    with TFRecordReader(path) as reader:
        assert reader.size is None
        reader.check_first_record()
        offsets = []
        for _ in range(20):
            offsets.append(reader.offset)
            reader.read()
        assert reader.read() is None
    with TFRecordReader(tmp_path / "r.tfrecord") as plain:
        assert list(plain) == records and plain.offset == reader.offset  # offsets of the same data
    for i in (0, 7, 19):
        with TFRecordReader(path, offsets[i]) as resumed:
            assert list(resumed) == records[i:]
    assert not open_files_under(tmp_path)


def test_a_gzipped_file_tensorflow_would_write_reads_back(tmp_path):
    with TFRecordReader(_gzip_file(tmp_path / "m.tfrecord.GZ", MORRIS_FILE)) as reader:
        assert list(reader) == MORRIS


def test_an_offset_past_the_end_of_a_gzipped_file_is_refused(tmp_path):
    path = _gzip_file(tmp_path / "m.tfrecord.gz", MORRIS_FILE)
    with pytest.raises(ValueError, match=r"offset 1000 is outside TFRecord file .* \(gzip\)"):
        TFRecordReader(path, 1000)
    with TFRecordReader(path) as reader:
        reader.read()
        with pytest.raises(ValueError, match=r"offset 1000 is outside"):
            reader.seek(1000)
        assert reader.read() == MORRIS[1]  # still where it was
    assert not open_files_under(tmp_path)


def test_damaged_gzip_data_is_named(tmp_path):
    big = b"".join(MORRIS_FILE for _ in range(400))
    path = _gzip_file(tmp_path / "cut.tfrecord.gz", big)
    path.write_bytes(path.read_bytes()[:-20])
    with TFRecordReader(path) as reader, pytest.raises(ValueError, match=r"cut\.tfrecord\.gz': its gzip data is damaged or truncated"):
        list(reader)
    (tmp_path / "not.tfrecord.gz").write_bytes(MORRIS_FILE)
    with TFRecordReader(tmp_path / "not.tfrecord.gz") as reader, pytest.raises(ValueError, match=r"gzip data is damaged .*Not a gzipped file"):
        reader.check_first_record()


def forged_header(length: int) -> bytes:
    """A record header whose length field passes its CRC but claims ``length`` bytes."""
    raw = struct.pack("<Q", length)
    return raw + struct.pack("<I", masked_crc(raw))


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("length", [1 << 30, 2**64 - 1])
def test_a_length_past_the_end_of_the_file_is_refused_without_allocating_it(tmp_path, gz, length):
    """A 44-byte file that claims a 1 GiB (or 2**64-byte) record: an error naming the file,
    the offset and both lengths, and memory for what the file holds, not what it claims."""
    data = MORRIS_FILE[:17] + forged_header(length) + b"x" * 15
    path = tmp_path / ("forged.tfrecord" + (".gz" if gz else ""))
    path.write_bytes(gzip.compress(data) if gz else data)
    assert len(data) == 44
    tracemalloc.start()
    try:
        with TFRecordReader(path) as reader:
            assert reader.read() == b"1"
            with pytest.raises(ValueError, match=rf"forged\.tfrecord(\.gz)?' is truncated: the record at byte "
                                                 rf"offset 17 says its data has {length:,} bytes .* but the file "
                                                 rf"has 15 bytes after its header"):
                reader.read()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 40 << 20, peak  # at most one bounded chunk (16 MiB) for a gzip stream


def test_a_file_that_grew_since_it_was_opened_reads_on(tmp_path):
    path = tmp_path / "growing.tfrecord"
    path.write_bytes(MORRIS_FILE[:17])
    with TFRecordReader(path) as reader:
        assert reader.read() == b"1"
        path.write_bytes(MORRIS_FILE)  # the writer finished after the reader opened the file
        assert reader.read() == b"1 1"


# One damage to a file: (what, position as a share of the file, a value).
DAMAGES = st.tuples(st.sampled_from(["flip", "truncate", "insert", "forge length"]),
                    st.floats(0, 1, exclude_max=True), st.integers(0, 2**64 - 1))


def _damage(data: bytes, damage, starts) -> bytes:
    what, where, value = damage
    i = int(where * len(data))
    if what == "flip":
        return data[:i] + bytes([data[i] ^ (1 << value % 8)]) + data[i + 1 :]
    if what == "truncate":
        return data[:i]
    if what == "insert":
        return data[:i] + value.to_bytes(8, "little")[: 1 + value % 8] + data[i:]
    start = starts[int(where * len(starts))]  # a record's length, replaced with a valid CRC
    return data[:start] + forged_header(value >> (value % 64)) + data[start + 12 :]


@settings(max_examples=200, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=st.lists(st.binary(max_size=30), min_size=1, max_size=5), damage=DAMAGES, gz=st.booleans())
def test_a_damaged_file_reads_a_prefix_of_its_records_then_a_named_error(tmp_path, records, damage, gz):
    """Whatever the damage, the reader yields records that were written, in order, and then
    either a ValueError naming the file and a byte offset, or the end, in which case the
    file is exactly the TFRecord file of what was read (a cut between records)."""
    write_tfrecord(tmp_path / "whole.tfrecord", records)
    whole = (tmp_path / "whole.tfrecord").read_bytes()
    starts = [0]
    for record in records[:-1]:
        starts.append(starts[-1] + 16 + len(record))
    damaged = _damage(whole, damage, starts)
    path = tmp_path / ("damaged.tfrecord" + (".gz" if gz else ""))
    path.write_bytes(gzip.compress(damaged) if gz else damaged)
    read: list[bytes] = []
    message = None
    try:
        with TFRecordReader(path) as reader:
            read.extend(reader)
    except ValueError as error:
        message = str(error)
    assert read == records[: len(read)]
    if message is None:
        write_tfrecord(tmp_path / "read.tfrecord", read)
        assert (tmp_path / "read.tfrecord").read_bytes() == damaged
    else:
        assert f"TFRecord file {str(path)!r}" in message and "byte offset" in message
