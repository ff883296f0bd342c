"""JsonlDataSource: records by index through an index of line offsets."""

from __future__ import annotations

import io
import json
import pickle

import numpy as np
import pytest

import dataloader as dl
from dataloader.sources import jsonl
from dataloader.sources.jsonl import line_starts


def write_lines(path, rows: list[object], *, blank_after: int | None = None, end: str = "\n") -> None:
    lines = [json.dumps(row) for row in rows]
    if blank_after is not None:
        lines.insert(blank_after + 1, "   ")
        lines.insert(blank_after + 1, "")
    path.write_text("\n".join(lines) + end)


def naive_starts(data: bytes) -> list[int]:
    """The starts of the non-blank lines, then the end: the rule, one line at a time."""
    out, position = [], 0
    for line in data.split(b"\n"):
        if line.strip():
            out.append(position)
        position += len(line) + 1
    return [*out, len(data)]


@pytest.mark.parametrize("block", [1, 2, 3, 7, 4096])
def test_line_starts_follow_the_rule_whatever_the_block_size(block, monkeypatch):
    monkeypatch.setattr(jsonl, "_BLOCK", block)
    rng = np.random.default_rng(block)
    pieces = [b"", b"  ", b'{"a": 1}', b" x ", b"\r", b"\t{}"]
    for _ in range(300):
        lines = [pieces[i] for i in rng.integers(0, len(pieces), int(rng.integers(0, 10)))]
        data = b"\n".join(lines) + (b"\n" if rng.random() < 0.5 else b"")
        assert line_starts(io.BytesIO(data)).tolist() == naive_starts(data), data


def test_records_are_the_non_blank_lines_in_order_across_files(tmp_path):
    write_lines(tmp_path / "a.jsonl", [{"i": i} for i in range(4)], blank_after=1)
    write_lines(tmp_path / "b.jsonl", [{"i": i} for i in range(4, 7)], end="")  # no last newline
    source = dl.JsonlDataSource(str(tmp_path / "*.jsonl"), index=False)
    assert len(source) == 7 and source.num_records_per_file == (4, 3)
    assert [source[i] for i in range(7)] == [{"i": i} for i in range(7)]
    assert source.__getitems__(np.array([6, 0, 2, 2, 3, 4])) == [{"i": i} for i in (6, 0, 2, 2, 3, 4)]


def test_parse_gives_json_str_or_bytes(tmp_path):
    (tmp_path / "a.jsonl").write_text('  {"t": "é"}  \r\n[1, 2]\n')
    path = str(tmp_path / "a.jsonl")
    assert dl.JsonlDataSource(path, index=False)[0] == {"t": "é"}
    assert dl.JsonlDataSource(path, parse="str", index=False)[1] == "[1, 2]"
    assert dl.JsonlDataSource(path, parse="bytes", index=False)[0] == '{"t": "é"}'.encode()
    with pytest.raises(ValueError, match="parse must be one of 'json', 'str', 'bytes', got 'yaml'"):
        dl.JsonlDataSource(path, parse="yaml")


def test_records_match_what_convert_writes(tmp_path):
    from dataloader.cli.convert import convert

    write_lines(tmp_path / "in.jsonl", [{"i": i, "s": "x" * i} for i in range(9)], blank_after=4)
    shards = convert([str(tmp_path / "in.jsonl")], str(tmp_path / "out" / "rows"), num_shards=2, progress=False)
    converted = dl.ArrayRecordDataSource(shards)
    source = dl.JsonlDataSource(str(tmp_path / "in.jsonl"), parse="bytes", index=False)
    assert source.__getitems__(range(9)) == converted.__getitems__(range(9))


def test_a_line_that_is_not_json_fails_when_read_naming_file_record_and_offset(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"ok": 1}\n{"broken": \n')
    source = dl.JsonlDataSource(str(tmp_path / "a.jsonl"), index=False)
    assert source[0] == {"ok": 1}
    with pytest.raises(ValueError, match=r"a\.jsonl': record 1 \(byte offset 10\) is not valid JSON"):
        source[1]
    assert source.record_location(1).endswith("a.jsonl' (record 1, byte offset 10)")


def test_bad_indices_are_refused_as_by_every_source(tmp_path):
    write_lines(tmp_path / "a.jsonl", [1, 2])
    source = dl.JsonlDataSource(str(tmp_path / "a.jsonl"), index=False)
    with pytest.raises(IndexError, match="record index 2 is out of range for a source of length 2"):
        source[2]
    with pytest.raises(TypeError, match="record index must be an integer"):
        source[0.5]


def test_gzip_files_are_refused_with_what_to_do(tmp_path):
    import gzip

    with gzip.open(tmp_path / "a.jsonl.gz", "wt") as out:
        out.write('{"a": 1}\n')
    with pytest.raises(ValueError, match=r"is gzip: a line cannot be read from an offset .* gunzip it"):
        dl.JsonlDataSource(str(tmp_path / "a.jsonl.gz"))


def test_the_source_travels_to_workers_with_its_offsets(tmp_path):
    write_lines(tmp_path / "a.jsonl", [{"i": i} for i in range(50)])
    source = dl.JsonlDataSource(str(tmp_path / "a.jsonl"), index=False)
    (tmp_path / "a.jsonl").write_text((tmp_path / "a.jsonl").read_text())  # same bytes, new time
    worker = pickle.loads(pickle.dumps(source))
    assert worker[49] == {"i": 49} and repr(worker) == repr(source)
    ds = dl.MapDataset.source(source).map(lambda row: row["i"]).batch(10).to_iter_dataset()
    pooled = ds.mp_prefetch(dl.MultiprocessingOptions(num_workers=2))
    assert [b.tolist() for b in pooled] == [list(range(i, i + 10)) for i in range(0, 50, 10)]


def test_a_large_source_travels_without_offsets_and_workers_take_them_from_the_index(tmp_path, monkeypatch):
    write_lines(tmp_path / "a.jsonl", [{"i": i} for i in range(30)])
    source = dl.JsonlDataSource(str(tmp_path / "a.jsonl"), index=True)
    monkeypatch.setattr(jsonl, "SHIPPED_RECORDS", 10)
    state = source.__getstate__()
    assert state["_starts"] == [None]
    monkeypatch.setattr(jsonl, "read_metadata", lambda *a: pytest.fail("scanned the file again"))
    worker = pickle.loads(pickle.dumps(source))
    assert worker.__getitems__([29, 3]) == [{"i": 29}, {"i": 3}]


def test_urls_are_read_by_ranges(tmp_path):
    import fsspec

    write_lines(tmp_path / "a.jsonl", [{"i": i} for i in range(20)], blank_after=3)
    store = fsspec.filesystem("memory")
    store.put(str(tmp_path / "a.jsonl"), "/granary-jsonl/a.jsonl")
    try:
        source = dl.JsonlDataSource("memory://granary-jsonl/*.jsonl", index="memory://granary-jsonl/idx.json")
        assert len(source.paths) == 1 and source.paths[0].endswith("granary-jsonl/a.jsonl")
        assert source.__getitems__([19, 0, 4, 5]) == [{"i": 19}, {"i": 0}, {"i": 4}, {"i": 5}]
        assert store.exists("/granary-jsonl/idx.json")
        again = dl.JsonlDataSource("memory://granary-jsonl/*.jsonl", index="memory://granary-jsonl/idx.json")
        assert pickle.loads(pickle.dumps(again))[7] == {"i": 7}
    finally:
        store.rm("/granary-jsonl", recursive=True)
