"""``python -m dataloader index PATHS``: the metadata index built ahead, then used."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dataloader as dl
from dataloader.cli.index import build_index, file_kind
from dataloader.sources import jsonl
from dataloader.sources.files.metadata_index import INDEX_NAME
from tests.helpers import REPO_ROOT


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dataloader", "index", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)


def data(folder) -> dict[str, str]:
    """One small file of each kind."""
    paths = {kind: str(folder / f"part-00000-of-00001.{kind}") for kind in ("array_record", "parquet", "jsonl")}
    dl.write_array_record(paths["array_record"], [b"a", b"b"])
    pq.write_table(pa.table({"x": [1, 2, 3]}), paths["parquet"])
    with open(paths["jsonl"], "w") as out:
        out.write('{"a": 1}\n\n{"a": 2}\n')
    return paths


def test_the_command_indexes_files_of_every_kind_beside_the_data(tmp_path):
    paths = data(tmp_path)
    done = cli(str(tmp_path / "part-*"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("indexed 3 files (array_record 1, jsonl 1, parquet 1) into ")
    entries = json.loads((tmp_path / INDEX_NAME).read_text())["files"]
    assert {os.path.basename(p): e["kind"] for p, e in entries.items()} == {
        os.path.basename(p): k for k, p in paths.items()}
    assert entries[paths["parquet"]]["meta"] == {"columns": ["x"], "row_groups": [3]}
    assert entries[paths["array_record"]]["meta"]["records"] == 2


def test_sources_then_start_without_reading_a_file(tmp_path, monkeypatch):
    paths = data(tmp_path)
    assert build_index([str(tmp_path / "part-*")]).startswith("indexed 3 files")
    monkeypatch.setattr(jsonl, "line_starts", lambda *a: pytest.fail("scanned a file"))
    assert dl.JsonlDataSource(paths["jsonl"])[1] == {"a": 2}
    from dataloader.sources import array_record, parquet

    monkeypatch.setattr(array_record, "read_metadata", lambda *a: pytest.fail("opened a file"))
    monkeypatch.setattr(parquet, "read_metadata", lambda *a: pytest.fail("read a footer"))
    assert len(dl.ArrayRecordDataSource(paths["array_record"])) == 2
    assert int(dl.ParquetDataSource(paths["parquet"])[2]["x"]) == 3


def test_running_it_again_rebuilds_a_stale_entry(tmp_path):
    paths = data(tmp_path)
    assert cli(paths["jsonl"]).returncode == 0
    with open(paths["jsonl"], "a") as out:
        out.write('{"a": 3}\n')
    with pytest.raises(ValueError, match=rf"Rebuild the index: python -m dataloader index {paths['jsonl']}$"):
        dl.JsonlDataSource(paths["jsonl"])
    assert cli(paths["jsonl"]).returncode == 0
    assert dl.JsonlDataSource(paths["jsonl"])[2] == {"a": 3}


def test_an_index_path_and_a_kind_can_be_named(tmp_path):
    (tmp_path / "rows.txt").write_text("1\n2\n")
    where = tmp_path / "cache" / "index.json"
    done = cli(str(tmp_path / "rows.txt"), "--kind=jsonl", f"--index_path={where}")
    assert done.returncode == 0, done.stderr
    assert f"into {where}" in done.stdout and not (tmp_path / INDEX_NAME).exists()
    assert dl.JsonlDataSource(str(tmp_path / "rows.txt"), index=str(where))[1] == 2


def test_urls_are_indexed_into_the_store(tmp_path):
    import fsspec

    store = fsspec.filesystem("memory")
    paths = data(tmp_path)
    store.put(paths["jsonl"], "/granary-cli-index/a.jsonl")
    try:
        report = build_index(["memory://granary-cli-index/*.jsonl"])
        assert report.startswith("indexed 1 files (jsonl 1) into memory://")
        assert store.exists(f"/granary-cli-index/{INDEX_NAME}")
        assert dl.JsonlDataSource("memory://granary-cli-index/*.jsonl")[1] == {"a": 2}
    finally:
        store.rm("/granary-cli-index", recursive=True)


@pytest.mark.parametrize(("name", "kind"), [
    ("a.array_record", "array_record"), ("x-00001-of-00004.arrayrecord", "array_record"),
    ("t.tfrecord-00000-of-00016", "tfrecord"), ("r.json", "jsonl"), ("p.parquet", "parquet")])
def test_the_kind_is_told_from_the_name(name, kind):
    assert file_kind(name) == kind


def test_bad_input_is_one_line_and_status_2(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    done = cli(str(tmp_path / "notes.txt"))
    assert done.returncode == 2
    assert "cannot tell the format of" in done.stderr and "--kind" in done.stderr
    done = cli(str(tmp_path / "none-*.jsonl"))
    assert done.returncode == 2 and "matches no file" in done.stderr
    assert cli().returncode != 0
    with pytest.raises(ValueError, match="is gzip: its records cannot be read from an offset"):
        file_kind("rows.jsonl.gz")
