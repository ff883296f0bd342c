"""Tests for write_array_record."""

from __future__ import annotations

import numpy as np
import pytest
from array_record.python.array_record_module import ArrayRecordReader

from dataloader.sources import write_array_record


def _read_all(path) -> list[bytes]:
    reader = ArrayRecordReader(str(path))
    try:
        return reader.read_all()
    finally:
        reader.close()


def _writer_options(path) -> str:
    reader = ArrayRecordReader(str(path))
    try:
        return reader.writer_options_string()
    finally:
        reader.close()


def test_writes_records_and_returns_count(tmp_path):
    path = tmp_path / "out.array_record"
    assert write_array_record(path, (bytes([i]) * i for i in range(5))) == 5
    assert _read_all(path) == [bytes([i]) * i for i in range(5)]


def test_accepts_bytes_like_records(tmp_path):
    path = tmp_path / "out.array_record"
    records = [bytearray(b"ab"), memoryview(b"cd"), np.array([1, 2], dtype=np.uint8)]
    write_array_record(path, records)
    assert _read_all(path) == [b"ab", b"cd", b"\x01\x02"]


def test_default_group_size_is_one(tmp_path):
    path = tmp_path / "out.array_record"
    write_array_record(path, [b"x"])
    assert _writer_options(path).startswith("group_size:1,")


def test_group_size_and_extra_options_reach_the_writer(tmp_path):
    path = tmp_path / "out.array_record"
    write_array_record(path, [b"x"], group_size=8, options="uncompressed")
    options = _writer_options(path)
    assert options.startswith("group_size:8,")
    assert "uncompressed" in options


def test_non_bytes_record_names_position_and_type(tmp_path):
    with pytest.raises(TypeError, match=r"record 2 is str, expected bytes.*text\.encode\(\)"):
        write_array_record(tmp_path / "out.array_record", [b"a", b"b", "c"])


def test_failure_leaves_no_file_under_final_name_and_no_temporary(tmp_path):
    def records():
        yield b"a"
        raise RuntimeError("source broke")

    with pytest.raises(RuntimeError, match="source broke"):
        write_array_record(tmp_path / "out.array_record", records())
    assert list(tmp_path.iterdir()) == []


def test_failure_keeps_existing_file(tmp_path):
    path = tmp_path / "out.array_record"
    write_array_record(path, [b"old"])
    with pytest.raises(TypeError, match="record 0 is int"):
        write_array_record(path, [7])
    assert _read_all(path) == [b"old"]
    assert list(tmp_path.iterdir()) == [path]


def test_group_size_below_one_is_refused(tmp_path):
    with pytest.raises(ValueError, match="group_size must be at least 1, got 0"):
        write_array_record(tmp_path / "out.array_record", [b"a"], group_size=0)


def test_group_size_in_options_is_refused(tmp_path):
    with pytest.raises(
        ValueError, match=r"options 'group_size:4' set group_size; pass group_size="
    ):
        write_array_record(tmp_path / "out.array_record", [b"a"], options="group_size:4")


def test_invalid_options_are_named(tmp_path):
    with pytest.raises(
        ValueError, match=r"invalid ArrayRecord writer options 'group_size:1,bogus'"
    ):
        write_array_record(tmp_path / "out.array_record", [b"a"], options="bogus")
    assert list(tmp_path.iterdir()) == []


def test_missing_folders_are_created_as_convert_creates_them(tmp_path):
    path = tmp_path / "data" / "train" / "out.array_record"
    assert write_array_record(path, [b"a", b"b"]) == 2
    assert _read_all(path) == [b"a", b"b"]
    assert sorted(p.name for p in path.parent.iterdir()) == ["out.array_record"]


def test_a_file_where_a_folder_must_be_is_named(tmp_path):
    (tmp_path / "data").write_bytes(b"not a folder")
    with pytest.raises(OSError, match=r"cannot write '.*data/out.array_record': cannot create its folder '.*data'"):
        write_array_record(tmp_path / "data" / "out.array_record", [b"a"])
