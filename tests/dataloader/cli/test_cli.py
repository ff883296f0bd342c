"""The command line: run, inspect, convert (in-process), and one real ``python -m dataloader``."""

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
import yaml
from absl import app

import dataloader as dl
from dataloader.cli import main as cli
from dataloader.cli.convert import convert
from dataloader.cli.inspect_records import describe_array_records
from dataloader.cli.progress import Progress
from tests.helpers import REPO_ROOT

ROOT = REPO_ROOT


def square(x):
    return x * x


def keep_even(x):
    return x % 2 == 0


@pytest.fixture
def config_path(tmp_path) -> str:
    data = {
        "source": {"kind": "dataloader.sources.RangeDataSource", "options": {"start": 40}},
        "sampler": {"num_epochs": 1},
        "operations": [{"map": f"{__name__}.square"}, {"filter": f"{__name__}.keep_even"},
                       {"batch": {"batch_size": 5}}],
    }
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_run_reports_throughput_first_batch_and_each_stage(config_path):
    text = cli.run_command([config_path], max_batches=None)
    assert "batches        4 (20 records)" in text
    for label in ("records/s", "first batch", "computing", "read", "MapTransform(square)",
                  "FilterTransform(keep_even)", "batch"):
        assert label in text, f"{label!r} missing from:\n{text}"


def test_run_applies_overrides_and_max_batches(config_path):
    text = cli.run_command([config_path, "operations.2.batch.batch_size=2"], max_batches=3)
    assert "batches        3 (6 records)" in text


def twice(x):
    return [x, x]


def range_loader(operations, num_epochs=1, shard=(0, 1), drop_remainder=False) -> dl.DataLoader:
    options = dl.ShardOptions(*shard, drop_remainder=drop_remainder)
    return dl.DataLoader(dl.RangeDataSource(40), dl.IndexSampler(40, options, num_epochs=num_epochs), operations)


@pytest.mark.parametrize(
    "operations",
    [[dl.FilterTransform(keep_even)], [dl.FlatMapTransform(twice)],
     [dl.Batch(5), dl.FilterTransform(lambda b: b[0] > 10)]],
    ids=["filter_without_batch", "flat_map_without_batch", "filter_after_batch"],
)
def test_progress_total_is_unknown_when_a_filter_or_flat_map_changes_the_count(operations):
    loader = range_loader(operations)
    assert cli._expected_batches(loader, None) is None
    assert cli._expected_batches(loader, 3) == 3


def test_progress_total_counts_batches_when_nothing_filters():
    assert cli._expected_batches(range_loader([dl.MapTransform(square), dl.Batch(6)]), None) == 7
    assert cli._expected_batches(range_loader([dl.Batch(6, drop_remainder=True)]), None) == 6
    assert cli._expected_batches(range_loader([dl.MapTransform(square)]), None) == 40


def test_default_limit_of_an_endless_stream_is_one_epoch_of_this_shard():
    loader = range_loader([dl.Batch(2)], num_epochs=None, shard=(2, 3), drop_remainder=True)
    assert cli._default_limit(loader) == (6, "one epoch's worth (the stream repeats for ever)")


def test_run_needs_a_config():
    with pytest.raises(app.UsageError, match="run needs a config"):
        cli.run_command([], max_batches=None)


def test_unknown_command_is_a_usage_error():
    with pytest.raises(app.UsageError, match="expected a command, one of run, inspect, convert, demo"):
        cli.main(["prog", "train"])


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_python_m_dataloader_run_draws_progress_and_refuses_a_bad_key(config_path):
    env = {**os.environ, "PYTHONPATH": ROOT}
    ok = subprocess.run([sys.executable, "-m", "dataloader", "run", config_path, "loader.worker_count=2"],
                        capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "pipeline.yaml 4 batches" in ok.stderr and "records/s" in ok.stdout  # the progress line
    assert "blocked on 2 worker(s)" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "dataloader", "run", config_path, "sampler.seed=abc"],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert bad.returncode == 2
    assert bad.stderr.strip() == "config error: sampler.seed: expected an integer (or null), got 'abc'"


def test_inspect_reports_files_records_group_size_and_a_record(tmp_path):
    for shard in range(2):
        dl.write_array_record(tmp_path / f"d-{shard}.array_record", [b'{"x": %d}' % i for i in range(3)])
    text = describe_array_records([str(tmp_path / "d-*.array_record")], index=4)
    assert text.splitlines()[0] == "2 file(s), 6 records"
    assert "3 records  group size 1" in text
    assert text.splitlines()[-1] == 'record 4 (8 bytes): JSON {"x": 1}'


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
