"""The command line: convert (in-process), progress, and the demo through ``python -m dataloader``.

``run`` and its report are in test_run.py, ``inspect`` in test_inspect.py.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dataloader as dl
from dataloader.cli.convert import convert
from dataloader.engine.stats.progress import Progress
from tests.helpers import REPO_ROOT

ROOT = REPO_ROOT


def read_all(paths: list[str]) -> list[bytes]:
    return dl.ArrayRecordDataSource(paths).__getitems__(range(len(dl.ArrayRecordDataSource(paths))))


def test_convert_jsonl_keeps_each_line_in_order_across_shards(tmp_path):
    lines = [json.dumps({"i": i}) for i in range(7)]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    paths = convert([str(tmp_path / "in.jsonl")], str(tmp_path / "out" / "rows"), num_shards=3, progress=False)
    assert [os.path.basename(p) for p in paths] == [f"rows-0000{i}-of-00003.array_record" for i in range(3)]
    assert [r.decode() for r in read_all(paths)] == lines


def test_convert_parquet_writes_rows_as_json(tmp_path):
    pq.write_table(pa.table({"x": [1, 2], "v": [[0.5, 1.0], [2.0]], "b": [b"\x00", b"hi"]}), tmp_path / "t.parquet")
    paths = convert([str(tmp_path / "t.parquet")], str(tmp_path / "t"), progress=False)
    assert [json.loads(r) for r in read_all(paths)] == [
        {"x": 1, "v": [0.5, 1.0], "b": "AA=="}, {"x": 2, "v": [2.0], "b": "aGk="}]


def test_convert_npy_writes_rows_as_npy(tmp_path):
    array = np.arange(12, dtype=np.int16).reshape(3, 2, 2)
    np.save(tmp_path / "a.npy", array)
    records = read_all(convert([str(tmp_path / "a.npy")], str(tmp_path / "a"), progress=False))
    np.testing.assert_array_equal(np.stack([np.load(io.BytesIO(r)) for r in records]), array)


def test_convert_npz_writes_one_row_of_each_array(tmp_path):
    np.savez(tmp_path / "z.npz", x=np.arange(6.0).reshape(3, 2), y=np.array([7, 8, 9]))
    records = read_all(convert([str(tmp_path / "z.npz")], str(tmp_path / "z"), progress=False))
    second = dict(np.load(io.BytesIO(records[1])))
    assert second["x"].tolist() == [2.0, 3.0] and int(second["y"]) == 8


def test_convert_refuses_an_unknown_extension(tmp_path):
    (tmp_path / "data.txt").write_text("a,b\n")
    with pytest.raises(ValueError, match=r"cannot tell the format of '.*data\.txt' from its extension"):
        convert([str(tmp_path / "data.txt")], str(tmp_path / "out"), progress=False)


def test_convert_csv_rows_as_json_objects(tmp_path):
    (tmp_path / "t.csv").write_text('a,b\n1,"x, y"\n2,z\n')
    records = read_all(convert([str(tmp_path / "t.csv")], str(tmp_path / "t"), progress=False))
    assert [json.loads(r) for r in records] == [{"a": "1", "b": "x, y"}, {"a": "2", "b": "z"}]


def test_convert_refuses_existing_output_and_replaces_it_whole(tmp_path):
    (tmp_path / "in.jsonl").write_text("".join(f'{{"i": {i}}}\n' for i in range(5)))
    prefix = str(tmp_path / "out" / "rows")
    convert([str(tmp_path / "in.jsonl")], prefix, num_shards=3, progress=False)
    with pytest.raises(dl.ConvertError, match=r"the output already exists \(.*rows-00000-of-00003\.array_record"):
        convert([str(tmp_path / "in.jsonl")], prefix, num_shards=2, progress=False)
    paths = convert([str(tmp_path / "in.jsonl")], prefix, num_shards=2, overwrite=True, progress=False)
    assert sorted(os.listdir(tmp_path / "out")) == [os.path.basename(p) for p in paths]


def test_convert_leaves_no_shard_when_an_input_fails_midway(tmp_path):
    (tmp_path / "a.jsonl").write_text("".join(f'{{"i": {i}}}\n' for i in range(4)))
    (tmp_path / "b.jsonl").write_text('{"i": 4}\n{"i": \n')
    with pytest.raises(ValueError, match=r"b\.jsonl:2 is not valid JSON"):
        convert([str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")], str(tmp_path / "out" / "r"),
                num_shards=2, progress=False)
    assert os.listdir(tmp_path / "out") == []


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_convert_without_beam_falls_back_to_this_process_or_says_what_to_install(tmp_path):
    (tmp_path / "in.jsonl").write_text('{"i": 0}\n{"i": 1}\n')
    no_beam = "import sys; sys.modules['apache_beam'] = None; from dataloader.cli.main import run; run()"
    env = {**os.environ, "PYTHONPATH": ROOT}

    def cli(*args):
        return subprocess.run([sys.executable, "-c", no_beam, "convert", "in.jsonl", "--output=out/r", *args],
                              capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)

    ok = cli("--num_shards=2")
    assert ok.returncode == 0, ok.stderr
    assert "Apache Beam is not installed: converting in this process" in ok.stderr
    assert read_all(sorted(str(p) for p in (tmp_path / "out").iterdir())) == [b'{"i": 0}', b'{"i": 1}']
    refused = cli("--overwrite", "--direct_num_workers=2")
    assert refused.returncode == 1
    assert "--direct_num_workers=2 needs Apache Beam; install it with pip install 'granary[beam]'" in refused.stderr


def test_progress_writes_a_final_line_with_count_and_rate():
    stream = io.StringIO()
    with Progress("writing", total=4, unit="records", stream=stream) as bar:
        bar.update(4)
    assert stream.getvalue().startswith("writing [" + "#" * Progress.WIDTH + "] 4/4 records ")
    assert stream.getvalue().endswith(" records/s\n")


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_python_m_dataloader_demo_picks_the_digits_or_the_language_model(tmp_path):
    env = {**os.environ, "PYTHONPATH": ROOT}
    digits = subprocess.run(
        [sys.executable, "-m", "dataloader", "demo", "--demo=digits", f"--out_dir={tmp_path}", "train.steps=12",
         "train.checkpoint_every=4", "train.preempt_at=10", "train.log_every=4", "loader.worker_count=0"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=240)
    assert digits.returncode == 0, digits.stderr[-2000:]
    assert "resume OK" in digits.stdout and os.path.isdir(tmp_path / "data")
    bad = subprocess.run([sys.executable, "-m", "dataloader", "demo", f"--out_dir={tmp_path}", "stpes=3"],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert bad.returncode == 2
    assert bad.stderr.strip().startswith("config error: stpes: unknown key; did you mean steps?")
    assert os.path.isdir(tmp_path / "data")  # nothing removed before the config was checked


def _tensorflow_shards(folder, name: str, count: int, gz: bool = False) -> list[list[bytes]]:
    """Writes ``name-0000i-of-0000N`` files as TensorFlow and TFDS name them; returns their records."""
    import gzip

    from dataloader.sources import write_tfrecord

    shards = [[b"%s-%d-%d" % (name.encode(), i, j) for j in range(4 + i)] for i in range(count)]
    for i, records in enumerate(shards):
        path = folder / f"{name}-{i:05d}-of-{count:05d}"
        write_tfrecord(path, records)
        if gz:
            with gzip.open(f"{path}.gz", "wb") as f:
                f.write(path.read_bytes())
            path.unlink()
    return shards


def test_python_m_dataloader_convert_reads_tensorflow_sharded_tfrecord_names(tmp_path):
    shards = _tensorflow_shards(tmp_path, "data.tfrecord", 3)
    out = subprocess.run(
        [sys.executable, "-m", "dataloader", "convert", str(tmp_path / "data.tfrecord-*"),
         f"--output={tmp_path / 'out' / 'data'}", "--num_shards=2"],
        capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    paths = sorted(str(p) for p in (tmp_path / "out").iterdir())
    assert [os.path.basename(p) for p in paths] == ["data-00000-of-00002.array_record", "data-00001-of-00002.array_record"]
    assert read_all(paths) == [r for records in shards for r in records]


@pytest.mark.parametrize("name", ["mnist-train.tfrecord", "data.tfrecord"])
def test_convert_in_process_reads_gzipped_and_tfds_named_tfrecords(tmp_path, name):
    shards = _tensorflow_shards(tmp_path, name, 2, gz=True)
    paths = convert([str(tmp_path / f"{name}-*.gz")], str(tmp_path / "out" / "x"), num_shards=3, progress=False)
    assert read_all(paths) == [r for records in shards for r in records]
