"""``python -m dataloader convert`` end to end: Beam options through absl, two worker
processes of the DirectRunner, --verify, and clear failures that leave nothing behind."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import dataloader as dl
from tests.dataloader.beam.helpers import beam_tfrecords, corrupt, parse_tfrecord
from tests.helpers import REPO_ROOT

TWO_WORKERS = ["--runner=DirectRunner", "--direct_num_workers=2", "--direct_running_mode=multi_processing"]

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess, pytest.mark.timeout(240)]


def cli(*args: str, cwd: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": REPO_ROOT}
    return subprocess.run([sys.executable, "-m", "dataloader", "convert", *args], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=200)


def test_two_worker_processes_write_what_one_writes_and_verify_it(tmp_path):
    files = beam_tfrecords(str(tmp_path), num_records=400, num_files=3)
    one = cli("tf/part-*.tfrecord", "--output=one/x", "--num_shards=3", cwd=str(tmp_path))
    assert one.returncode == 0, one.stderr
    two = cli("tf/part-*.tfrecord", "--output=two/x", "--num_shards=3", "--verify", *TWO_WORKERS, cwd=str(tmp_path))
    assert two.returncode == 0, two.stderr
    assert "wrote 3 shard(s), 400 records" in two.stdout
    assert "two/x-00002-of-00003.array_record           134 records" in two.stdout
    assert two.stdout.count("records, checksum") == 3 and "converting to 3 shard(s)" in two.stderr
    for shard in range(3):
        name = f"x-{shard:05d}-of-00003.array_record"
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()
    source = dl.ArrayRecordDataSource(str(tmp_path / "two" / "x-*.array_record"))
    assert source.__getitems__(range(len(source))) == [r for f in files for r in parse_tfrecord(f)]


def test_match_shards_with_two_workers_and_a_refusal_to_overwrite(tmp_path):
    files = beam_tfrecords(str(tmp_path), num_records=90, num_files=3)
    ok = cli(*files, "--output=out/m", "--match_shards", *TWO_WORKERS, cwd=str(tmp_path))
    assert ok.returncode == 0, ok.stderr
    assert sorted(os.listdir(tmp_path / "out")) == [f"m-part-0000{i}-of-00003.array_record" for i in range(3)]
    again = cli(*files, "--output=out/m", "--match_shards", cwd=str(tmp_path))
    assert again.returncode == 2
    assert "convert: the output already exists (out/m-part-00000-of-00003.array_record" in again.stderr
    assert "pass --overwrite" in again.stderr


def test_a_bad_crc_in_a_worker_process_fails_cleanly(tmp_path):
    files = beam_tfrecords(str(tmp_path), num_records=90, num_files=2)
    first = parse_tfrecord(files[0])
    offset = 16 + len(first[0])  # record 1
    bad = corrupt(files[0], offset + 13, str(tmp_path / "bad.tfrecord"))
    out = cli(files[1], "bad.tfrecord", "--output=out/x", "--num_shards=2", *TWO_WORKERS, cwd=str(tmp_path))
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1] == (
        f"convert: TFRecord file {os.path.basename(bad)!r}: the data of the record at byte offset "
        f"{offset} ({len(first[1])} bytes) fails its CRC check; the file is corrupt")
    assert os.listdir(tmp_path / "out") == []  # neither a shard nor the staging folder


def test_a_mistyped_flag_is_refused_not_passed_to_beam(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"i": 1}\n')
    out = cli("a.jsonl", "--output=out/x", "--num_shard=2", cwd=str(tmp_path))
    assert out.returncode == 2
    assert "unknown flag(s) --num_shard: neither a convert flag nor an Apache Beam pipeline option" in out.stderr
    assert not (tmp_path / "out").exists() or os.listdir(tmp_path / "out") == []
