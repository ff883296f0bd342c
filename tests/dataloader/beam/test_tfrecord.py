"""TFRecord files read in order through Beam's codec, with errors that say where."""

from __future__ import annotations

import pathlib

import pytest

from dataloader.beam import tfrecord
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
    with pytest.raises(ValueError, match=rf"bad\.tfrecord: record 4 at byte offset {offset}: its data fails the CRC check"):
        list(tfrecord.read(bad))


def test_a_bad_length_crc_is_found_by_count_and_read(files, tmp_path):
    bad = corrupt(files[0], 3, str(tmp_path / "len.tfrecord"))
    with pytest.raises(ValueError, match=r"len\.tfrecord: record header at byte offset 0 fails its CRC check"):
        tfrecord.count(bad)
    with pytest.raises(ValueError, match=r"len\.tfrecord: record 0 at byte offset 0: its length fails the CRC check"):
        list(tfrecord.read(bad))


def test_a_truncated_file_names_the_offset_of_the_cut_record(files, tmp_path):
    data = pathlib.Path(files[0]).read_bytes()
    records = parse_tfrecord(files[0])
    last = len(data) - 16 - len(records[-1])
    cut = tmp_path / "cut.tfrecord"
    cut.write_bytes(data[:-5])
    with pytest.raises(ValueError, match=rf"cut\.tfrecord: truncated at byte offset {last}: the record there needs"):
        tfrecord.count(str(cut))
    with pytest.raises(ValueError, match=rf"cut\.tfrecord: record {len(records) - 1} at byte offset {last}: truncated"):
        list(tfrecord.read(str(cut)))
