"""The metadata index: read once, used by every source kind, stale entries refused by name."""

from __future__ import annotations

import json
import os
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dataloader as dl
from dataloader.sources import array_record, jsonl, parquet, tfrecord
from dataloader.sources.files.metadata_index import INDEX_NAME, MetadataIndex
from tests.helpers import run_threads

KINDS = ["array_record", "parquet", "tfrecord", "jsonl"]


def write(folder, kind: str, name: str, rows: int) -> str:
    """A file of ``kind`` with ``rows`` records ``0 .. rows - 1``."""
    path = str(folder / f"{name}.{kind}")
    if kind == "array_record":
        dl.write_array_record(path, [b"%d" % i for i in range(rows)])
    elif kind == "parquet":
        pq.write_table(pa.table({"x": list(range(rows))}), path, row_group_size=3)
    elif kind == "tfrecord":
        dl.write_tfrecord(path, [b"%d" % i for i in range(rows)])
    else:
        with open(path, "w") as out:
            out.writelines(f"{i}\n" for i in range(rows))
    return path


def build(kind: str, paths, index=None):
    """The source of ``kind`` over ``paths`` (a TFRecord stream on the engine), and its
    records as ints."""
    if kind == "array_record":
        source = dl.ArrayRecordDataSource(paths, index=index)
        return [int(r) for r in source.__getitems__(range(len(source)))]
    if kind == "parquet":
        source = dl.ParquetDataSource(paths, index=index)
        return [int(r["x"]) for r in source.__getitems__(range(len(source)))]
    if kind == "tfrecord":
        return sorted(int(r) for r in dl.experimental.TFRecordIterDataset(paths, index=index).map(bytes))
    source = dl.JsonlDataSource(paths, index=index)
    return source.__getitems__(range(len(source)))


def count_reads(monkeypatch, kind: str) -> list[str]:
    """Every file whose metadata is read from then on (the function that reads it, wrapped)."""
    reads: list[str] = []
    module = {"array_record": array_record, "parquet": parquet, "tfrecord": tfrecord.index, "jsonl": jsonl}[kind]
    original = module.read_metadata

    def counted(stats, *args, **kwargs):
        reads.extend(stat.path for stat in stats)
        return original(stats, *args, **kwargs)

    monkeypatch.setattr(module, "read_metadata", counted)
    return reads


@pytest.fixture(autouse=True)
def _fresh_offsets(monkeypatch):
    """TFRecord streams remember offsets per process (as MaxText's one dataset per file and
    epoch needs): start from none, so each test sees what the index does."""
    from dataloader.dataset.streams import tfrecord_source

    monkeypatch.setattr(tfrecord_source, "_KNOWN", {})


@pytest.mark.parametrize("kind", KINDS)
def test_metadata_is_read_once_then_taken_from_the_index_beside_the_data(tmp_path, monkeypatch, kind):
    if kind == "tfrecord":
        pytest.importorskip("google_crc32c")
    paths = [write(tmp_path, kind, f"f{i}", 5 + i) for i in range(3)]
    reads = count_reads(monkeypatch, kind)
    expected = sorted(i for n in (5, 6, 7) for i in range(n))
    assert sorted(build(kind, paths, index=True)) == expected
    assert sorted(reads) == sorted(paths)  # each file once, written to the index
    entries = json.loads((tmp_path / INDEX_NAME).read_text())["files"]
    assert sorted(entries) == sorted(os.path.abspath(p) for p in paths)
    assert {e["kind"] for e in entries.values()} == {kind}
    reads.clear()
    from dataloader.dataset.streams import tfrecord_source

    tfrecord_source._KNOWN.clear()
    assert sorted(build(kind, paths)) == expected  # index=None: the index beside the data
    assert reads == []


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("change", ["touched", "resized"])
def test_a_stale_entry_is_refused_by_name_never_read(tmp_path, monkeypatch, kind, change):
    if kind == "tfrecord":
        pytest.importorskip("google_crc32c")
    paths = [write(tmp_path, kind, f"f{i}", 4) for i in range(2)]
    build(kind, paths, index=True)
    if change == "touched":
        later = time.time() + 100
        os.utime(paths[1], (later, later))
        what = r"its modification time is \S+ now, \S+ when the index read it"
    else:
        write(tmp_path, kind, "f1", 20000)  # (an ArrayRecord file grows in 64 KiB blocks)
        what = r"its size was [\d,]+ bytes and is [\d,]+ now( and its modification time .*)?"
    reads = count_reads(monkeypatch, kind)
    pattern = (rf"the index '.*{INDEX_NAME}' has a stale entry for '{paths[1]}': {what}; it was "
               rf"not read\. Rebuild the index: python -m dataloader index {paths[1]}")
    with pytest.raises(ValueError, match=pattern):
        build(kind, paths)
    assert reads == []
    assert sorted(build(kind, paths, index=False)) != []  # without the index it reads the file


def test_an_index_elsewhere_is_used_and_written_there_and_the_hint_names_it(tmp_path):
    paths = [write(tmp_path, "jsonl", f"f{i}", 3) for i in range(2)]
    where = str(tmp_path / "cache" / "meta.json")
    assert build("jsonl", paths, index=where) == [0, 1, 2, 0, 1, 2]
    assert not (tmp_path / INDEX_NAME).exists() and os.path.exists(where)
    write(tmp_path, "jsonl", "f0", 5)
    with pytest.raises(ValueError, match=rf"index {paths[0]} --index_path={where}$"):
        build("jsonl", paths, index=where)


def test_index_none_reads_but_never_writes_and_index_false_ignores_it(tmp_path, monkeypatch):
    paths = [write(tmp_path, "jsonl", "f0", 3)]
    build("jsonl", paths)
    assert not (tmp_path / INDEX_NAME).exists()
    build("jsonl", paths, index=True)
    write(tmp_path, "jsonl", "f0", 4)
    assert build("jsonl", paths, index=False) == [0, 1, 2, 3]


def test_a_glob_never_takes_the_index_for_data(tmp_path):
    write(tmp_path, "jsonl", "f0", 3)
    build("jsonl", [str(tmp_path / "f0.jsonl")], index=True)
    source = dl.JsonlDataSource(str(tmp_path / "*"))
    assert source.paths == (str(tmp_path / "f0.jsonl"),)


def test_an_index_is_only_ever_whole_while_several_writers_write_it(tmp_path):
    """Writers merge what is there, then replace it by rename: a reader never sees a
    half-written index (whatever the interleaving), and what is written is right."""
    paths = [write(tmp_path, "jsonl", f"f{i}", 2 + i) for i in range(8)]
    finished: list[int] = []

    def write_or_read(i: int) -> None:
        if i == 8:  # the reader: every index it finds parses, with right entries
            while len(finished) < 8:
                if (tmp_path / INDEX_NAME).exists():
                    check(MetadataIndex.load(str(tmp_path / INDEX_NAME)))
            return
        try:
            for _ in range(5):
                assert build("jsonl", [paths[i]], index=True) == list(range(2 + i))
        finally:
            finished.append(i)

    def check(index: MetadataIndex) -> None:
        for i, path in enumerate(paths):
            entry = index.entries.get(path)
            if entry is not None:
                assert len(jsonl.unpack_ints(entry["meta"]["starts"])) == 3 + i

    run_threads(write_or_read, 9)
    final = MetadataIndex.load(str(tmp_path / INDEX_NAME))
    assert final.entries
    check(final)
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]


def test_a_file_that_is_not_an_index_is_refused(tmp_path):
    write(tmp_path, "jsonl", "f0", 1)
    (tmp_path / INDEX_NAME).write_text('{"version": 1, "patterns": []}')
    with pytest.raises(ValueError, match=rf"'{tmp_path / INDEX_NAME}' is not a granary metadata index"):
        dl.JsonlDataSource(str(tmp_path / "f0.jsonl"))


def test_an_index_argument_of_the_wrong_type_is_refused(tmp_path):
    path = write(tmp_path, "jsonl", "f0", 1)
    with pytest.raises(TypeError, match=r"index must be None .* got int 3"):
        dl.JsonlDataSource(path, index=3)


def test_a_local_index_is_parsed_once_per_process_while_it_is_unchanged(tmp_path, monkeypatch):
    paths = [write(tmp_path, "jsonl", f"f{i}", 2) for i in range(6)]
    build("jsonl", paths[:5], index=True)
    parsed = []
    original = MetadataIndex._parse
    monkeypatch.setattr(MetadataIndex, "_parse", staticmethod(lambda *a: parsed.append(1) or original(*a)))
    for path in paths[:5]:  # one source a file, as MaxText builds them
        assert build("jsonl", [path]) == [0, 1]
    assert len(parsed) == 1
    build("jsonl", paths, index=True)  # a new entry: the index changes, and is read again
    parsed.clear()
    assert build("jsonl", [paths[5]]) == [0, 1] and len(parsed) == 1
