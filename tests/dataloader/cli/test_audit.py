"""``python -m dataloader audit LOG_A LOG_B``: the first step where two audit logs differ."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import pytest

import dataloader as dl
from dataloader.cli.audit import audit_command
from dataloader.cli.main import main


class Table:
    """An in-memory source whose records a test may change."""

    def __init__(self, records: list[bytes]) -> None:
        self.records = records

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> bytes:
        return self.records[int(i)]


def first_byte(record: bytes) -> int:
    return record[0]


def second_byte(record: bytes) -> int:
    return record[1]


def logged_run(path, records, steps: int, *, state=None, workers: int = 0, op=first_byte) -> dict:
    sampler = dl.IndexSampler(len(records), shuffle=True, seed=4, num_epochs=1)
    loader = dl.DataLoader(
        Table(records), sampler, [dl.MapTransform(op), dl.Batch(3)],
        worker_count=workers, audit_log=str(path),
    )
    it = loader.iterator(state)
    for _ in itertools.islice(it, steps):
        pass
    saved = it.get_state()
    it.close()
    return saved


RECORDS = [bytes([i, i + 1]) for i in range(30)]


def test_identical_logs_agree_and_exit_0(tmp_path):
    logged_run(tmp_path / "a", RECORDS, 6)
    logged_run(tmp_path / "b", RECORDS, 6)
    report, status = audit_command([str(tmp_path / "a"), str(tmp_path / "b")])
    assert status == 0 and report == "the logs agree on all 6 steps they share"


def test_a_restarted_run_appending_to_its_log_agrees_with_an_uninterrupted_one(tmp_path):
    logged_run(tmp_path / "full", RECORDS, 8)
    state = logged_run(tmp_path / "restarted", RECORDS, 3)
    logged_run(tmp_path / "restarted", RECORDS, 5, state=json.loads(json.dumps(state)), workers=2)
    report, status = audit_command([str(tmp_path / "full"), str(tmp_path / "restarted")])
    assert status == 0, report


def test_the_first_differing_step_is_named_with_the_record_whose_bytes_differ(tmp_path):
    logged_run(tmp_path / "a", RECORDS, 6)
    line = json.loads((tmp_path / "a").read_text().splitlines()[3])  # step 4
    record = line["fingerprint"]["record_keys"][1]
    changed = list(RECORDS)
    changed[record] = bytes([RECORDS[record][0], 99])  # the map's output stays the same
    logged_run(tmp_path / "b", changed, 6)
    report, status = audit_command([str(tmp_path / "a"), str(tmp_path / "b")])
    assert status == 1
    assert report.startswith(f"first difference at step 4 (shard 0, state after it at position 12): "
                             f"the source bytes of records {record} differ")


def test_a_changed_map_is_named_as_the_operations_output(tmp_path):
    logged_run(tmp_path / "a", RECORDS, 4)
    logged_run(tmp_path / "b", RECORDS, 4, op=second_byte)
    report, status = audit_command([str(tmp_path / "a"), str(tmp_path / "b")])
    assert status == 1
    assert report.startswith("first difference at step 1 (shard 0, state after it at position 3): "
                             "the records and their bytes are the same, but the operations' output differs")


def test_logs_without_a_common_step_differ(tmp_path):
    state = logged_run(tmp_path / "a", RECORDS, 2)
    logged_run(tmp_path / "b", RECORDS, 2, state=state)
    report, status = audit_command([str(tmp_path / "a"), str(tmp_path / "b")])
    assert status == 1 and "share no step" in report


def test_a_file_that_is_not_an_audit_log_exits_2_naming_the_line(tmp_path):
    logged_run(tmp_path / "a", RECORDS, 2)
    (tmp_path / "b").write_text('{"shard": 0, "position": 3, "sub_index": 0, "skip": 0}\nnot json\n')
    report, status = audit_command([str(tmp_path / "a"), str(tmp_path / "b")])
    assert status == 2 and f"{tmp_path / 'b'}:2 is not a line of an audit log" in report


def test_the_command_line_exits_non_zero_on_a_difference(tmp_path, capsys):
    logged_run(tmp_path / "a", RECORDS, 3)
    changed = [bytes([r[0] + 1, r[1]]) for r in RECORDS]
    logged_run(tmp_path / "b", changed, 3)
    assert main(["dataloader", "audit", str(tmp_path / "a"), str(tmp_path / "a")]) == 0
    assert main(["dataloader", "audit", str(tmp_path / "a"), str(tmp_path / "b")]) == 1
    assert "first difference at step 1 " in capsys.readouterr().out


@pytest.mark.slow
def test_python_m_dataloader_audit_exits_1_on_a_difference(tmp_path):
    logged_run(tmp_path / "a", RECORDS, 2)
    logged_run(tmp_path / "b", [bytes([r[0], 7]) for r in RECORDS], 2)
    done = subprocess.run(
        [sys.executable, "-m", "dataloader", "audit", str(tmp_path / "a"), str(tmp_path / "b")],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 1 and "source bytes of records" in done.stdout
