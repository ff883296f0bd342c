"""A state's fingerprint: its last step's records, checked on restore."""

from __future__ import annotations

import itertools
import json
import os

import numpy as np
import pytest

import dataloader as dl
from dataloader.engine import fingerprint
from dataloader.errors import StateMismatchError
from tests.dataloader.pipelines import make_loader

WIDTH = 8


class FixedWidthFile:
    """Records of ``WIDTH`` bytes in a file, read at each access (as a file source does),
    so a file rewritten under the same name reads its new bytes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._n = os.path.getsize(path) // WIDTH

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int) -> bytes:
        with open(self.path, "rb") as f:
            f.seek(int(i) * WIDTH)
            return f.read(WIDTH)


def write_records(path, n: int, changed: int | None = None) -> None:
    with open(path, "wb") as f:
        for i in range(n):
            text = f"r{i:06d}" if i != changed else "CHANGED!"
            f.write(text.encode()[:WIDTH].ljust(WIDTH))


def decode(record: bytes) -> dict:
    return {"x": np.frombuffer(record, dtype=np.uint8).astype(np.int64)}


def scaled_by(factor: int):
    def scale(element):  # the same name for every factor: a state records only the name
        return {"x": element["x"] * factor}

    return scale


def file_loader(path, *, factor: int = 1, worker_count: int = 0, shard=(0, 1), batch: int = 4, **kw):
    sampler = dl.IndexSampler(40, dl.ShardOptions(*shard), shuffle=True, seed=3, num_epochs=2)
    ops = [dl.MapTransform(decode), dl.MapTransform(scaled_by(factor)), dl.Batch(batch)]
    return dl.DataLoader(FixedWidthFile(str(path)), sampler, ops, worker_count=worker_count, **kw)


def run(loader, steps: int) -> tuple[list, list[dict]]:
    it = iter(loader)
    outputs, states = [], []
    for x in itertools.islice(it, steps):
        outputs.append(x)
        states.append(json.loads(json.dumps(it.get_state())))
    if hasattr(it, "close"):
        it.close()
    return outputs, states


def test_every_state_after_a_step_carries_that_steps_fingerprint(tmp_path):
    write_records(tmp_path / "data", 40)
    _, states = run(file_loader(tmp_path / "data"), 3)
    fp = states[2]["fingerprint"]
    assert fp["step"] == 3 and fp["count"] == 4 and fp["output_index"] == 0
    assert fp["local_start"] == 8 and fingerprint.global_positions(fp).tolist() == [8, 9, 10, 11]
    assert len(json.dumps(fp)) < 300  # a few hundred bytes, never data


@pytest.mark.parametrize(
    "name", ["batch", "filter", "flat_map", "filter_batch", "everything", "batch_then_flat_map"]
)
def test_a_restore_with_unchanged_data_passes_and_gives_the_same_states_every_step(name):
    loader = make_loader(name)
    _, states = run(loader, 30)
    for k in range(len(states) - 1):
        it = loader.iterator(states[k])  # verifies the fingerprint: the data did not change
        assert it.get_state() == states[k], f"step {k}"
        for j in range(k + 1, min(k + 4, len(states))):
            next(it)
            assert json.loads(json.dumps(it.get_state())) == states[j], f"restored at {k}, step {j}"


def test_a_source_file_rewritten_with_one_record_changed_is_refused_naming_it(tmp_path):
    path = tmp_path / "data"
    write_records(path, 40)
    _, states = run(file_loader(path), 5)
    state = states[-1]
    record = fingerprint.record_keys(file_loader(path).plan, state["fingerprint"])[2]
    write_records(path, 40, changed=int(record))  # regenerated under the same name
    with pytest.raises(StateMismatchError, match=rf"source bytes of record {record} \(1 of the 4 records of step 5\)"):
        file_loader(path).iterator(state)
    it = iter(file_loader(path))
    with pytest.raises(StateMismatchError, match="a data file rewritten under the same name"):
        it.set_state(state)


def test_a_changed_map_function_is_refused_naming_the_operations_output(tmp_path):
    path = tmp_path / "data"
    write_records(path, 40)
    _, states = run(file_loader(path, factor=2), 3)
    with pytest.raises(StateMismatchError, match="read the same bytes, but the operations' output differs"):
        file_loader(path, factor=3).iterator(states[-1])


def test_a_changed_filter_is_refused():
    def keep(x):
        return x % 3 != 0

    def keep_other(x):
        return x % 3 != 1

    keep_other.__qualname__ = keep.__qualname__  # same name: only the behaviour changed

    def loader(f):
        sampler = dl.IndexSampler(30, shuffle=True, seed=1, num_epochs=1)
        return dl.DataLoader(dl.RangeDataSource(30), sampler, [dl.FilterTransform(f), dl.Batch(4)])

    _, states = run(loader(keep), 2)
    with pytest.raises(StateMismatchError, match="operations' output differs"):
        loader(keep_other).iterator(states[-1])


def test_verify_on_restore_false_restores_anyway(tmp_path):
    path = tmp_path / "data"
    write_records(path, 40)
    outputs, states = run(file_loader(path, factor=2), 4)
    it = file_loader(path, factor=3, verify_on_restore=False).iterator(states[1])
    assert np.array_equal(next(it)["x"], outputs[2]["x"] // 2 * 3)


def test_an_old_state_without_a_fingerprint_restores(tmp_path):
    write_records(tmp_path / "data", 40)
    loader = file_loader(tmp_path / "data")
    outputs, states = run(loader, 6)
    old = {k: v for k, v in states[2].items() if k != "fingerprint"}
    it = loader.iterator(old)
    assert "fingerprint" not in it.get_state()
    assert np.array_equal(next(it)["x"], outputs[3]["x"])
    # From there on the states carry fingerprints again; the step count is unknown.
    fp = it.get_state()["fingerprint"]
    assert fp["step"] is None and {**fp, "step": 4} == states[3]["fingerprint"]


def test_a_loader_without_fingerprints_makes_states_without_one(tmp_path):
    write_records(tmp_path / "data", 40)
    _, states = run(file_loader(tmp_path / "data", fingerprint=False), 2)
    assert "fingerprint" not in states[-1]


def test_a_malformed_fingerprint_is_refused_naming_the_field(tmp_path):
    write_records(tmp_path / "data", 40)
    _, states = run(file_loader(tmp_path / "data"), 2)
    state = states[-1]
    state["fingerprint"]["count"] = 0
    with pytest.raises(StateMismatchError, match=r"fingerprint.count=0 is invalid: expected an integer >= 1"):
        file_loader(tmp_path / "data").iterator(state)


@pytest.mark.parametrize("pipeline", ["filter_batch", "everything"])
def test_a_restore_with_another_worker_count_passes(pipeline):
    _, states = run(make_loader(pipeline), 8)
    it = make_loader(pipeline, worker_count=2).iterator(states[3])
    try:
        assert it.get_state() == states[3]
        for j in range(4, 8):
            next(it)
            assert json.loads(json.dumps(it.get_state())) == states[j]
    finally:
        it.close()


def test_the_records_of_a_worker_computed_step_match_those_of_this_process(tmp_path):
    write_records(tmp_path / "data", 40)
    _, in_process = run(file_loader(tmp_path / "data"), 5)
    _, in_workers = run(file_loader(tmp_path / "data", worker_count=2), 5)
    assert in_process == in_workers


def test_an_elastic_restore_on_another_host_count_checks_the_same_records(tmp_path):
    path = tmp_path / "data"
    write_records(path, 40)
    _, states = run(file_loader(path, shard=(1, 2), batch=4), 3)
    state = states[-1]
    # Shard 1 of 2 read global positions 17, 19, 21, 23 last; one host at batch 8 reads them too.
    assert fingerprint.global_positions(state["fingerprint"]).tolist() == [17, 19, 21, 23]
    it = file_loader(path, shard=(0, 1), batch=8).iterator(state)
    assert it.get_state()["position"] == 24
    record = fingerprint.record_keys(file_loader(path, batch=8).plan, state["fingerprint"])[3]
    write_records(path, 40, changed=int(record))
    with pytest.raises(StateMismatchError, match=rf"source bytes of record {record} "):
        file_loader(path, shard=(0, 1), batch=8).iterator(state)


def test_a_random_map_step_is_verified_with_its_own_numbers_on_a_sharded_stream():
    loader = make_loader("random_map_batch", shard=(1, 3))
    _, states = run(loader, 4)
    loader.iterator(states[-1])  # the generators are keyed by global position: no refusal


def test_a_packer_state_checks_the_engines_last_records():
    def tokens(i):
        return {"tokens": np.arange(1 + i % 5)}

    def loader():
        sampler = dl.IndexSampler(60, shuffle=True, seed=2, num_epochs=1)
        return dl.DataLoader(dl.RangeDataSource(60), sampler, [dl.MapTransform(tokens), dl.FirstFitPack({"tokens": 8}, 2)])

    it = iter(loader())
    for _ in range(12):
        next(it)
    state = it.get_state()
    # The packer restarts from its engine's state, whose fingerprint is that of the
    # engine's last element before the restart point.
    assert state["stages"]["parent"]["fingerprint"]["count"] == 1
    assert loader().iterator(state).get_state() == state


def test_the_audit_log_has_a_line_per_step_with_its_record_keys(tmp_path):
    write_records(tmp_path / "data", 40)
    log = tmp_path / "audit.jsonl"
    _, states = run(file_loader(tmp_path / "data", audit_log=str(log)), 3)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 3]
    assert lines[2]["position"] == states[2]["position"] and lines[2]["shard"] == 0
    keys = fingerprint.record_keys(file_loader(tmp_path / "data").plan, states[2]["fingerprint"]).tolist()
    assert lines[2]["fingerprint"] == {**states[2]["fingerprint"], "record_keys": keys}


def test_a_sharded_audit_log_needs_the_shard_in_its_path(tmp_path):
    write_records(tmp_path / "data", 40)
    with pytest.raises(ValueError, match=r"put \{shard\} in the path"):
        file_loader(tmp_path / "data", shard=(0, 2), audit_log=str(tmp_path / "log"))
    loader = file_loader(tmp_path / "data", shard=(1, 2), audit_log=str(tmp_path / "log-{shard}"))
    run(loader, 1)
    assert (tmp_path / "log-1").exists()


def test_the_device_iterator_reports_the_fingerprint_of_the_last_batch_it_handed_out(tmp_path):
    pytest.importorskip("jax")
    write_records(tmp_path / "data", 40)
    loader = file_loader(tmp_path / "data")
    _, states = run(loader, 6)
    it = dl.device_prefetch(iter(loader), cpu_buffer_size=3, device_buffer_size=2)
    try:
        next(it), next(it)
        assert it.get_state() == states[1]
    finally:
        it.close()


def test_a_grain_state_restored_into_an_iterator_that_has_run_carries_no_fingerprint(tmp_path):
    """A Grain state has none; the restoring iterator's own must not come along."""
    pytest.importorskip("orbax.checkpoint")
    from tests.dataloader.test_checkpoint import grain_dataloader_state, grain_sampler, loader_30

    (tmp_path / "process_0-of-1.json").write_text(grain_dataloader_state([9], grain_sampler(False, None)))
    running = iter(loader_30(False, None))
    for _ in range(4):
        next(running)
    assert "fingerprint" in running.get_state()
    it = dl.PyGrainCheckpointHandler().restore(tmp_path, args=dl.PyGrainCheckpointRestore(running))
    assert "fingerprint" not in it.get_state() and it.get_state()["position"] == 10
    running2 = iter(loader_30(False, None))
    next(running2)
    running2.set_state(json.loads(grain_dataloader_state([9], grain_sampler(False, None))))
    assert "fingerprint" not in running2.get_state()


def test_an_orbax_restore_over_a_rewritten_file_is_refused_naming_the_file_and_record(tmp_path):
    pytest.importorskip("orbax.checkpoint")
    from tests.dataloader.test_checkpoint import manager, restore, save

    path = tmp_path / "data"
    write_records(path, 40)
    it = iter(file_loader(path))
    for _ in range(3):
        next(it)
    record = fingerprint.record_keys(file_loader(path).plan, it.get_state()["fingerprint"])[0]
    with manager(tmp_path / "ckpt", asynchronous=False) as mngr:
        save(mngr, 3, it)
        mngr.wait_until_finished()
        write_records(path, 40, changed=int(record))
        with pytest.raises(StateMismatchError, match=rf"process_0-of-1.json: .*source bytes of record {record} "):
            restore(mngr, 3, iter(file_loader(path)))


def odd_last_digit(element: dict) -> bool:
    return int(element["x"][6]) % 2 == 1  # the last digit of r000017


def filtered_file_loader(path, shard):
    sampler = dl.IndexSampler(40, dl.ShardOptions(*shard), shuffle=True, seed=3, num_epochs=1)
    ops = [dl.MapTransform(decode), dl.FilterTransform(odd_last_digit), dl.Batch(2)]
    return dl.DataLoader(FixedWidthFile(str(path)), sampler, ops)


def test_an_elastic_restore_from_every_hosts_state_checks_each_old_state_on_one_new_host(tmp_path):
    path = tmp_path / "data"
    write_records(path, 40)
    old = []
    for h in range(2):
        _, states = run(filtered_file_loader(path, (h, 2)), 2 + h)  # the hosts stopped apart
        old.append(states[-1])
    for j in range(3):  # unchanged data: every new host restores
        iter(filtered_file_loader(path, (j, 3))).set_state(old)
    # Old host 1's last record changes: new host 1 (of 3) checks old state 1 and refuses.
    record = int(fingerprint.record_keys(filtered_file_loader(path, (0, 1)).plan, old[1]["fingerprint"])[-1])
    write_records(path, 40, changed=record)
    iter(filtered_file_loader(path, (0, 3))).set_state(old)  # checks old state 0 only
    with pytest.raises(StateMismatchError, match=rf"source bytes of record {record} "):
        iter(filtered_file_loader(path, (1, 3))).set_state(old)
