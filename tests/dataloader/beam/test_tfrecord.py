"""TFRecord files read in order through the one frame codec, with errors that say where."""

from __future__ import annotations

import gzip
import pathlib
import tracemalloc

import numpy as np
import pytest

from dataloader.beam import tfrecord
from dataloader.beam.record_files import for_file
from dataloader.sources import write_tfrecord
from tests.dataloader.beam.helpers import beam_tfrecords, corrupt, parse_tfrecord


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> list[str]:
    return beam_tfrecords(str(tmp_path_factory.mktemp("tfrecord")), num_records=60, num_files=2)


def test_reads_the_files_beam_wrote_record_for_record(files):
    for path in files:
        expected = parse_tfrecord(path)
        assert tfrecord.count(path) == len(expected)
        assert list(tfrecord.read(path)) == expected


@pytest.mark.parametrize(("start", "stop"), [(0, 3), (5, None), (7, 12), (29, 29), (100, None)])
def test_reads_any_range_of_records(files, start, stop):
    assert list(tfrecord.read(files[0], start=start, stop=stop)) == parse_tfrecord(files[0])[start:stop]


def test_a_bad_data_crc_names_the_file_the_record_and_its_byte_offset(files, tmp_path):
    first = parse_tfrecord(files[0])
    offset = sum(16 + len(r) for r in first[:4])  # record 4 starts here
    bad = corrupt(files[0], offset + 12 + 2, str(tmp_path / "bad.tfrecord"))  # a byte of its data
    assert tfrecord.count(bad) == len(first)  # counting checks headers only
    with pytest.raises(ValueError, match=rf"bad\.tfrecord': the data of the record at byte offset {offset} .* fails its CRC check"):
        list(tfrecord.read(bad))


def test_a_bad_length_crc_is_found_by_count_and_read(files, tmp_path):
    bad = corrupt(files[0], 3, str(tmp_path / "len.tfrecord"))
    with pytest.raises(ValueError, match=r"len\.tfrecord': the length of the record at byte offset 0 fails its CRC check"):
        tfrecord.count(bad)
    with pytest.raises(ValueError, match=r"len\.tfrecord': the length of the record at byte offset 0 fails its CRC check"):
        list(tfrecord.read(bad))


def test_a_truncated_file_names_the_offset_of_the_cut_record(files, tmp_path):
    data = pathlib.Path(files[0]).read_bytes()
    records = parse_tfrecord(files[0])
    last = len(data) - 16 - len(records[-1])
    cut = tmp_path / "cut.tfrecord"
    cut.write_bytes(data[:-5])
    with pytest.raises(ValueError, match=rf"cut\.tfrecord' is truncated: the record at byte offset {last} says its data has"):
        tfrecord.count(str(cut))
    with pytest.raises(ValueError, match=rf"cut\.tfrecord' is truncated: the record at byte offset {last} says its data has"):
        list(tfrecord.read(str(cut)))


def test_a_length_field_past_the_end_is_refused_without_allocating_it(tmp_path):
    """A header that passes its CRC but claims 1 GiB: read names the record, its offset and
    both lengths, reading only what the file has (count already checks the file size)."""
    from dataloader.sources.tfrecord import masked_crc

    raw = (1 << 30).to_bytes(8, "little")
    (tmp_path / "forged.tfrecord").write_bytes(raw + masked_crc(raw).to_bytes(4, "little") + b"x" * 32)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"forged\.tfrecord' is truncated: the record at byte offset 0 says its "
                                             r"data has 1,073,741,824 bytes .* the file has 32 bytes after its header"):
            list(tfrecord.read(str(tmp_path / "forged.tfrecord")))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 40 << 20, peak


# Gzipped TFRecord files (``NAME.tfrecord.gz``), written by granary's own writer.


def _gzipped(folder: pathlib.Path, records: list[bytes], name: str = "data.tfrecord.gz") -> str:
    plain = folder / "plain.tfrecord"
    write_tfrecord(plain, records)
    path = folder / name
    with gzip.open(path, "wb") as f:
        f.write(plain.read_bytes())
    return str(path)


def _records(n: int) -> list[bytes]:
    return [b"rec-%04d-" % i + b"y" * (i % 23) for i in range(n)]


@pytest.mark.parametrize(("start", "stop"), [(0, None), (0, 3), (5, None), (7, 12), (40, 40), (100, None)])
def test_a_gzipped_file_reads_like_the_plain_one(tmp_path, start, stop):
    records = _records(40)
    path = _gzipped(tmp_path, records)
    fmt = for_file(tfrecord.TFRECORD, path)
    assert fmt.count(path) == 40
    assert list(fmt.read(path, start=start, stop=stop)) == records[start:stop]


def test_a_gzipped_file_is_streamed_not_loaded_whole(tmp_path):
    rng = np.random.default_rng(0)
    records = [rng.bytes(10_000) for _ in range(1500)]  # 15 MB that gzip cannot shrink
    path = _gzipped(tmp_path, records)
    fmt = for_file(tfrecord.TFRECORD, path)
    tracemalloc.start()
    try:
        count = fmt.count(path)
        last = None
        for record in fmt.read(path, start=700):
            last = record
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert count == 1500 and last == records[-1]
    assert peak < 2_000_000, peak


def test_a_record_cut_inside_a_whole_gzip_stream_is_named(tmp_path):
    records = _records(10)
    plain = tmp_path / "plain.tfrecord"
    write_tfrecord(plain, records)
    path = tmp_path / "cut.tfrecord.gz"
    with gzip.open(path, "wb") as f:
        f.write(plain.read_bytes()[:-5])
    last = plain.stat().st_size - 16 - len(records[-1])
    fmt = for_file(tfrecord.TFRECORD, str(path))
    with pytest.raises(ValueError, match=rf"cut\.tfrecord\.gz' is truncated: the record at byte offset {last} says its data has"):
        fmt.count(str(path))
    with pytest.raises(ValueError, match=rf"cut\.tfrecord\.gz' is truncated: the record at byte offset {last} says its data has"):
        list(fmt.read(str(path)))


def test_a_truncated_gzip_stream_is_named(tmp_path):
    path = pathlib.Path(_gzipped(tmp_path, _records(300)))
    path.write_bytes(path.read_bytes()[:-100])
    fmt = for_file(tfrecord.TFRECORD, str(path))
    with pytest.raises(ValueError, match=r"data\.tfrecord\.gz'?: its gzip data is damaged or truncated"):
        fmt.count(str(path))
    with pytest.raises(ValueError, match=r"data\.tfrecord\.gz'?: its gzip data is damaged or truncated"):
        list(fmt.read(str(path)))
