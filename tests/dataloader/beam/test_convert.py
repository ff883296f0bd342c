"""The conversion pipeline on Beam's DirectRunner (in this process): exact, ordered,
atomic, and the same bytes as the single-process converter."""

from __future__ import annotations

import io
import json
import os
import pathlib

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dataloader as dl
from dataloader.beam import ReadRecordFiles, WriteToArrayRecord, convert, verify
from dataloader.beam.files import expand_inputs
from dataloader.cli.convert import convert as convert_in_process
from dataloader.errors import ConvertError
from dataloader.sources import write_array_record, write_tfrecord
from tests.dataloader.beam.helpers import beam_tfrecords, corrupt, parse_tfrecord


def read_back(paths) -> list[bytes]:
    source = dl.ArrayRecordDataSource(list(paths))
    return source.__getitems__(range(len(source)))


def files_in(folder) -> list[str]:
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


@pytest.fixture(scope="module")
def tfrecords(tmp_path_factory) -> list[str]:
    return beam_tfrecords(str(tmp_path_factory.mktemp("beam")))


def test_tfrecords_written_by_beam_convert_exactly_in_order(tfrecords, tmp_path):
    result = convert(tfrecords, str(tmp_path / "out" / "tf"), num_shards=4, progress=False)
    expected = [r for path in tfrecords for r in parse_tfrecord(path)]
    assert [s.count for s in result.shards] == [75, 75, 75, 75]
    assert read_back(result.paths) == expected
    assert files_in(tmp_path / "out") == [os.path.basename(p) for p in result.paths]  # no staging left
    reference = convert_in_process(tfrecords, str(tmp_path / "ref" / "tf"), num_shards=4, progress=False)
    for ours, theirs in zip(result.paths, reference, strict=True):  # the very same bytes
        assert pathlib.Path(ours).read_bytes() == pathlib.Path(theirs).read_bytes()
    assert len(verify(result)) == 4


def write_inputs(folder) -> dict[str, tuple[list[str], list]]:
    """Two files of each format and the decoded records they hold, in order."""
    os.makedirs(folder)
    out: dict[str, tuple[list[str], list]] = {}
    rows = [{"i": i, "name": f"n{i}", "v": [i, i + 0.5]} for i in range(23)]
    paths = [os.path.join(folder, f"p{k}.parquet") for k in range(2)]
    pq.write_table(pa.Table.from_pylist(rows[:10]), paths[0], row_group_size=4)
    pq.write_table(pa.Table.from_pylist(rows[10:]), paths[1], row_group_size=4)
    out["parquet"] = (paths, rows)
    paths = [os.path.join(folder, f"j{k}.jsonl") for k in range(2)]
    for k, part in enumerate((rows[:7], rows[7:])):
        with open(paths[k], "w") as f:
            f.write("\n".join(json.dumps(r) for r in part) + "\n")
    out["jsonl"] = (paths, rows)
    cells = [{"id": str(i), "text": f"a,b {i}"} for i in range(23)]
    paths = [os.path.join(folder, f"c{k}.csv") for k in range(2)]
    for k, part in enumerate((cells[:12], cells[12:])):
        with open(paths[k], "w") as f:
            f.write("id,text\n" + "".join(f'{c["id"]},"{c["text"]}"\n' for c in part))
    out["csv"] = (paths, cells)
    array = np.arange(23 * 3, dtype=np.float32).reshape(23, 3)
    paths = [os.path.join(folder, f"a{k}.npy") for k in range(2)]
    np.save(paths[0], array[:5])
    np.save(paths[1], array[5:])
    out["npy"] = (paths, list(array))
    return out


DECODE = {"parquet": json.loads, "jsonl": json.loads, "csv": json.loads, "npy": lambda r: np.load(io.BytesIO(r))}


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "csv", "npy"])
def test_every_format_converts_to_the_single_process_bytes(fmt, tmp_path):
    paths, expected = write_inputs(tmp_path / "in")[fmt]
    result = convert(paths, str(tmp_path / "out" / fmt), num_shards=3, progress=False)
    decoded = [DECODE[fmt](r) for r in read_back(result.paths)]
    if fmt == "npy":
        np.testing.assert_array_equal(np.stack(decoded), np.stack(expected))
    else:
        assert decoded == expected
    reference = convert_in_process(paths, str(tmp_path / "ref" / fmt), num_shards=3, progress=False)
    assert read_back(result.paths) == read_back(reference)


def test_match_shards_writes_one_shard_per_input_named_after_it(tfrecords, tmp_path):
    result = convert(tfrecords, str(tmp_path / "out" / "m"), match_shards=True, progress=False)
    assert [os.path.basename(p) for p in result.paths] == [
        f"m-part-0000{i}-of-00003.array_record" for i in range(3)]
    for path, source in zip(result.paths, tfrecords, strict=True):
        assert read_back([path]) == parse_tfrecord(source)


def test_existing_output_is_refused_or_replaced_whole(tmp_path):
    (tmp_path / "in.jsonl").write_text("".join(f'{{"i": {i}}}\n' for i in range(10)))
    prefix = str(tmp_path / "out" / "x")
    first = convert([str(tmp_path / "in.jsonl")], prefix, num_shards=3, progress=False)
    with pytest.raises(ConvertError, match=r"the output already exists \(.*x-00000-of-00003\.array_record, .*; "
                                           r"pass --overwrite \(overwrite=True\) to replace all of it"):
        convert([str(tmp_path / "in.jsonl")], prefix, num_shards=2, progress=False)
    assert files_in(tmp_path / "out") == [os.path.basename(p) for p in first.paths]
    second = convert([str(tmp_path / "in.jsonl")], prefix, num_shards=2, overwrite=True, progress=False)
    assert files_in(tmp_path / "out") == ["x-00000-of-00002.array_record", "x-00001-of-00002.array_record"]
    assert [json.loads(r)["i"] for r in read_back(second.paths)] == list(range(10))


def bad_inputs(tfrecords, folder) -> dict[str, tuple[str, str]]:
    """Bad files, and the error each must raise."""
    first = parse_tfrecord(tfrecords[0])
    offset = sum(16 + len(r) for r in first[:7])
    crc = corrupt(tfrecords[0], offset + 14, os.path.join(folder, "crc.tfrecord"))
    data = pathlib.Path(tfrecords[0]).read_bytes()
    cut = os.path.join(folder, "cut.tfrecord")
    pathlib.Path(cut).write_bytes(data[: offset + 20])
    junk = os.path.join(folder, "junk.parquet")
    pathlib.Path(junk).write_bytes(b"PAR1" + b"\0" * 64 + b"PAR1")
    return {
        "bad_crc": (crc, rf"crc\.tfrecord': the data of the record at byte offset {offset} .* fails its CRC check"),
        "truncated": (cut, rf"cut\.tfrecord' is truncated: the record at byte offset {offset} "),
        "unreadable_parquet": (junk, r"junk\.parquet is not a readable Parquet file"),
    }


@pytest.mark.parametrize("case", ["bad_crc", "truncated", "unreadable_parquet"])
@pytest.mark.parametrize("mode", [{"num_shards": 2}, {"match_shards": True}], ids=["num_shards", "match_shards"])
def test_bad_input_names_the_file_and_place_and_leaves_the_old_output_alone(case, mode, tfrecords, tmp_path):
    (tmp_path / "in").mkdir()
    path, message = bad_inputs(tfrecords, str(tmp_path / "in"))[case]
    prefix = str(tmp_path / "out" / "x")
    os.makedirs(tmp_path / "out")
    write_array_record(prefix + "-00000-of-00001.array_record", [b"old"])
    with pytest.raises(ConvertError, match=message):
        convert([tfrecords[1], path], prefix, overwrite=True, progress=False, **mode)
    assert files_in(tmp_path / "out") == ["x-00000-of-00001.array_record"]  # no partial shard, no staging
    assert read_back([prefix + "-00000-of-00001.array_record"]) == [b"old"]


def test_verify_finds_a_shard_that_changed_after_writing(tmp_path):
    (tmp_path / "in.jsonl").write_text("".join(f'{{"i": {i}}}\n' for i in range(6)))
    result = convert([str(tmp_path / "in.jsonl")], str(tmp_path / "x"), num_shards=2, group_size=2, progress=False)
    assert verify(result) == [f"{s.path}: 3 records, checksum {s.checksum} ok" for s in result.shards]
    write_array_record(result.paths[1], [b'{"i": 3}', b'{"i": 5}', b'{"i": 4}'])
    with pytest.raises(ConvertError, match=r"x-00001-of-00002\.array_record reads back 3 records with checksum "):
        verify(result)


def test_unknown_beam_flag_and_more_shards_than_records_are_refused(tmp_path):
    (tmp_path / "in.jsonl").write_text('{"i": 0}\n{"i": 1}\n')
    with pytest.raises(ConvertError, match=r"unknown flag\(s\) --num_shard: neither a convert flag nor an Apache Beam"):
        convert([str(tmp_path / "in.jsonl")], str(tmp_path / "x"), pipeline_args=["--num_shard=2"])
    with pytest.raises(ConvertError, match=r"argument --project: expected one argument \(write them as --name=value\)"):
        convert([str(tmp_path / "in.jsonl")], str(tmp_path / "x"), pipeline_args=["--project"])
    with pytest.raises(ConvertError, match=r"2 records cannot fill 3 shards; use num_shards <= 2"):
        convert([str(tmp_path / "in.jsonl")], str(tmp_path / "x"), num_shards=3, progress=False)
    assert files_in(tmp_path) == ["in.jsonl"]


def test_read_record_files_then_write_to_array_record_keeps_order_within_each_shard(tfrecords, tmp_path):
    files = expand_inputs([os.path.join(os.path.dirname(tfrecords[0]), "part-*.tfrecord")])
    assert files == tfrecords
    outputs = []
    for run, shuffle in enumerate([False, True]):
        prefix = str(tmp_path / f"run{run}" / "w")
        with beam.Pipeline() as p:
            records = p | ReadRecordFiles(files)
            if shuffle:  # another arrival order must give the same files
                records = records | beam.Reshuffle()
            _ = records | WriteToArrayRecord(prefix, num_shards=3)
        paths = [f"{prefix}-{s:05d}-of-00003.array_record" for s in range(3)]
        assert files_in(tmp_path / f"run{run}") == [os.path.basename(p) for p in paths]
        outputs.append([pathlib.Path(p).read_bytes() for p in paths])
        by_key = {r: (f, i) for f, path in enumerate(files) for i, r in enumerate(parse_tfrecord(path))}
        shards = [dl.ArrayRecordDataSource(p) for p in paths]
        got = [[s[i] for i in range(len(s))] for s in shards]
        assert sorted(r for shard in got for r in shard) == sorted(by_key)
        for shard in got:
            assert [by_key[r] for r in shard] == sorted(by_key[r] for r in shard)
    assert outputs[0] == outputs[1]
    with pytest.raises(ConvertError, match=r"the output already exists"):
        WriteToArrayRecord(str(tmp_path / "run0" / "w"), num_shards=3)


def test_the_docs_cluster_commands_pass_only_flags_that_beam_or_convert_know():
    """The Dataflow, Flink and Spark lines of docs/conversion.md cannot run here; their
    flags are checked instead."""
    import re

    from dataloader.beam import pipeline_options
    from tests.test_docs import ROOT

    page = ROOT / "docs" / "conversion.md"
    blocks = re.findall(r"^```text\n(.*?)^```", page.read_text(), re.S | re.M)
    lines = [line for block in blocks for line in block.splitlines() if "python -m dataloader convert" in line]
    runners = set()
    for line in lines:
        flags = [word for word in line.split() if word.startswith("--")]
        ours = {"--output", "--match_shards", "--num_shards", "--overwrite", "--verify", "--group_size", "--format"}
        beam_flags = [f for f in flags if f.split("=")[0] not in ours]
        options = pipeline_options(beam_flags).get_all_options()
        runners.add(options["runner"])
    assert runners == {"DataflowRunner", "FlinkRunner", "SparkRunner"}


def test_write_to_array_record_checks_its_writer_options_at_construction(tmp_path):
    with pytest.raises(ValueError, match=r"invalid ArrayRecord writer options 'group_size:2,colour:blue'"):
        WriteToArrayRecord(str(tmp_path / "w"), num_shards=2, writer_options="group_size:2,colour:blue")
    with pytest.raises(ValueError, match=r"writer_options 'group_size:0': group_size must be a positive integer"):
        WriteToArrayRecord(str(tmp_path / "w"), writer_options="group_size:0")
    assert files_in(tmp_path) == []


def test_match_shards_names_tfds_and_gzipped_inputs_by_stem_and_shard(tmp_path):
    import gzip

    folder = tmp_path / "in"
    folder.mkdir()
    expected = {}
    for i in range(2):  # TFDS's names, the second shard gzipped
        records = [b"mnist-%d-%d" % (i, j) for j in range(3 + i)]
        path = folder / f"mnist-train.tfrecord-{i:05d}-of-00002"
        write_tfrecord(path, records)
        if i == 1:
            with gzip.open(f"{path}.gz", "wb") as f:
                f.write(path.read_bytes())
            path.unlink()
        expected[f"m-mnist-train-{i:05d}-of-00002.array_record"] = records
    result = convert([str(folder / "mnist-train.tfrecord-*")], str(tmp_path / "out" / "m"), match_shards=True,
                     progress=False)
    assert [os.path.basename(p) for p in result.paths] == list(expected)
    for path, records in zip(result.paths, expected.values(), strict=True):
        assert read_back([path]) == records
