"""Record files read in order as encoded bytes: conversion's contract, format by format."""

from __future__ import annotations

import gzip
import io
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dataloader.beam.record_files import (
    RECORD_FORMATS,
    FileName,
    for_file,
    input_format,
    split_name,
)


def read(fmt, path, start=0, stop=None):
    return list(RECORD_FORMATS[fmt].read(str(path), start=start, stop=stop))


def test_csv_rows_become_json_objects_of_the_cells_text(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text('id,text,score\n1,"a, quoted\nline",0.5\n\n2,plain,\n', encoding="utf-8")
    assert RECORD_FORMATS["csv"].count(str(path)) == 2
    assert [json.loads(r) for r in read("csv", path)] == [
        {"id": "1", "text": "a, quoted\nline", "score": "0.5"}, {"id": "2", "text": "plain", "score": ""}]
    assert [json.loads(r)["id"] for r in read("csv", path, start=1)] == ["2"]


def test_csv_row_with_the_wrong_number_of_cells_names_the_line(tmp_path):
    path = tmp_path / "ragged.csv"
    path.write_text("a,b\n1,2\n3,4,5\n")
    with pytest.raises(ValueError, match=r"ragged\.csv:3: 3 cells, but the header has 2 columns \(a, b\)"):
        read("csv", path)


def test_jsonl_skips_blank_lines_and_names_a_bad_line(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"i": 0}\n\n  {"i": 1}  \n{"i": 2}\nnot json\n')
    assert read("jsonl", path, 0, 3) == [b'{"i": 0}', b'{"i": 1}', b'{"i": 2}']
    assert read("jsonl", path, 1, 2) == [b'{"i": 1}']
    with pytest.raises(ValueError, match=r"r\.jsonl:5 is not valid JSON"):
        read("jsonl", path)


def test_parquet_ranges_cross_row_groups_in_order(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"x": list(range(10)), "b": [bytes([i]) for i in range(10)]}), path, row_group_size=3)
    rows = [json.loads(r) for r in read("parquet", path)]
    assert rows[4] == {"x": 4, "b": "BA=="}
    for start, stop in [(0, 10), (2, 7), (3, 6), (9, None), (5, 5)]:
        assert [json.loads(r)["x"] for r in read("parquet", path, start, stop)] == list(range(10))[start:stop]


def test_unreadable_parquet_names_the_file(tmp_path):
    path = tmp_path / "junk.parquet"
    path.write_bytes(b"PAR1 this is not parquet PAR1")
    with pytest.raises(ValueError, match=r"junk\.parquet is not a readable Parquet file"):
        RECORD_FORMATS["parquet"].count(str(path))


def test_a_damaged_row_group_is_named(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"x": list(range(100))}), path, row_group_size=50, compression="snappy")
    column = pq.ParquetFile(path).metadata.row_group(1).column(0)
    data = bytearray(path.read_bytes())
    start = column.dictionary_page_offset or column.data_page_offset
    data[start:start + 24] = b"\xff" * 24  # the first page header of row group 1
    path.write_bytes(bytes(data))
    assert len(read("parquet", path, 0, 50)) == 50  # row group 0 is intact
    with pytest.raises(ValueError, match=r"t\.parquet: row group 1 \(rows 50 to 99\) cannot be read"):
        read("parquet", path)


def test_npy_and_npz_ranges(tmp_path):
    array = np.arange(24, dtype=np.int32).reshape(6, 2, 2)
    np.save(tmp_path / "a.npy", array)
    np.savez(tmp_path / "z.npz", x=array, y=np.arange(6))
    rows = [np.load(io.BytesIO(r)) for r in read("npy", tmp_path / "a.npy", 2, 5)]
    np.testing.assert_array_equal(np.stack(rows), array[2:5])
    last = dict(np.load(io.BytesIO(read("npz", tmp_path / "z.npz", 5)[0])))
    assert last["x"].tolist() == array[5].tolist() and int(last["y"]) == 5


def test_a_truncated_npy_file_names_the_file(tmp_path):
    np.save(tmp_path / "a.npy", np.arange(100))
    data = (tmp_path / "a.npy").read_bytes()
    (tmp_path / "a.npy").write_bytes(data[:-40])
    with pytest.raises(ValueError, match=r"a\.npy is not a readable numpy file"):
        RECORD_FORMATS["npy"].count(str(tmp_path / "a.npy"))


def test_format_comes_from_the_extension_or_the_flag():
    assert input_format("d/part-00001.tfrecord") == "tfrecord"
    assert input_format("d/rows.CSV") == "csv"
    assert input_format("d/rows.txt", "jsonl") == "jsonl"
    with pytest.raises(ValueError, match=r"cannot tell the format of 'rows\.txt' from its extension; name it with --format"):
        input_format("rows.txt")


@pytest.mark.parametrize(("path", "fmt"), [
    ("d/data.tfrecord-00000-of-00003", "tfrecord"),  # TensorFlow's sharded names
    ("d/mnist-train.tfrecord-00007-of-00016", "tfrecord"),  # TFDS
    ("d/data.tfrecord.gz", "tfrecord"),
    ("d/data.tfrecord-00000-of-00003.gz", "tfrecord"),
    ("gs://b/part-00001-of-00004.tfrecords.GZ", "tfrecord"),
    ("d/rows.jsonl-00001-of-00002", "jsonl"),
    ("d/rows.csv.gz", "csv"),
])
def test_format_is_told_past_shard_numbers_and_gz(path, fmt):
    assert input_format(path) == fmt


@pytest.mark.parametrize(("path", "parts"), [
    ("gs://b/mnist-train.tfrecord-00003-of-00016.gz", ("mnist-train", ".tfrecord", "-00003-of-00016", True)),
    ("d/data.tfrecord.gz-00000-of-00002", ("data", ".tfrecord", "-00000-of-00002", True)),
    ("d/part-00001-of-00004.tfrecord", ("part-00001-of-00004", ".tfrecord", "", False)),
    ("d/c.data", ("c.data", "", "", False)),  # an unknown extension stays in the stem
    ("d/b.JSONL", ("b", ".jsonl", "", False)),
])
def test_split_name_cuts_stem_extension_shard_and_gzip(path, parts):
    assert split_name(path) == FileName(*parts)


def test_array_record_inputs_are_told_they_need_no_conversion():
    with pytest.raises(ValueError, match=r"'d/x\.array_record-00000-of-00010' is already ArrayRecord; read it with ArrayRecordDataSource"):
        input_format("d/x.array_record-00000-of-00010")


@pytest.mark.parametrize("name", ["t.parquet.gz", "a.npy.gz", "z.npz-00000-of-00002.gz"])
def test_gzipped_formats_read_in_slices_are_refused(name):
    with pytest.raises(ValueError, match=rf"'{name}' is gzip-compressed .*; decompress it first \(gunzip\)"):
        input_format(name)


def test_gzipped_jsonl_and_csv_read_like_the_plain_files(tmp_path):
    lines = "".join(f'{{"i": {i}}}\n' for i in range(7))
    table = "id,text\n" + "".join(f"{i},t{i}\n" for i in range(5))
    for name, text in (("r.jsonl", lines), ("t.csv", table)):
        plain, packed = tmp_path / name, tmp_path / f"{name}.gz"
        plain.write_text(text)
        with gzip.open(packed, "wt") as f:
            f.write(text)
        fmt = RECORD_FORMATS[input_format(str(plain))]
        gz = for_file(fmt, str(packed))
        assert for_file(fmt, str(plain)) is fmt
        assert gz.count(str(packed)) == fmt.count(str(plain))
        assert list(gz.read(str(packed), start=2, stop=4)) == list(fmt.read(str(plain), start=2, stop=4))
        assert list(gz.read(str(packed))) == list(fmt.read(str(plain)))


def test_a_damaged_gzip_file_is_named(tmp_path):
    path = tmp_path / "r.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write("".join(f'{{"i": {i}}}\n' for i in range(2000)))
    path.write_bytes(path.read_bytes()[:-30])
    fmt = for_file(RECORD_FORMATS["jsonl"], str(path))
    with pytest.raises(ValueError, match=r"r\.jsonl\.gz: its gzip data is damaged or truncated"):
        fmt.count(str(path))
    with pytest.raises(ValueError, match=r"r\.jsonl\.gz: its gzip data is damaged or truncated"):
        list(fmt.read(str(path)))
    path.write_bytes(b"not gzip at all")
    with pytest.raises(ValueError, match=r"r\.jsonl\.gz: its gzip data is damaged or truncated \(Not a gzipped file"):
        fmt.count(str(path))
