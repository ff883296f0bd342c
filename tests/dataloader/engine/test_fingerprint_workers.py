"""The fingerprint check with worker processes: the step is recomputed by the workers
(no user code in the training process), and the stream goes on as if restored directly."""

from __future__ import annotations

import itertools
import json
import os
import signal

import pytest

import dataloader as dl
from tests.dataloader.engine.test_fingerprint import (
    FixedWidthFile,
    decode,
    file_loader,
    write_records,
)
from tests.dataloader.pipelines import as_dict, keep_not_multiple_of_3, make_loader, repeat_by_mod
from tests.helpers import assert_streams_equal

pytestmark = pytest.mark.multiprocess


class RecordPid:
    """A map that appends the process id it runs in to a file, one line per call."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, x):
        with open(self.path, "a") as f:
            f.write(f"{os.getpid()}\n")
        return x


class KillOnce:
    """A map that kills its own process the first time it runs while ``flag`` exists
    (removing the flag first, so the unit computed again passes)."""

    def __init__(self, flag: str) -> None:
        self.flag = flag

    def __call__(self, x):
        try:
            os.remove(self.flag)
        except FileNotFoundError:
            return x
        os.kill(os.getpid(), signal.SIGKILL)
        return x


LAYOUTS = {
    "batch": lambda: [dl.MapTransform(as_dict), dl.Batch(4)],
    "regroup": lambda: [
        dl.MapTransform(as_dict), dl.FilterTransform(keep_not_multiple_of_3),
        dl.FlatMapTransform(repeat_by_mod, max_fan_out=2), dl.Batch(4),
    ],
    "elements": lambda: [dl.MapTransform(as_dict), dl.FlatMapTransform(repeat_by_mod, max_fan_out=2)],
}


def layout_loader(name: str, first_op, *, worker_count: int = 2, **kw):
    sampler = dl.IndexSampler(23, shuffle=True, seed=7, num_epochs=3)
    return dl.DataLoader(
        data_source=dl.RangeDataSource(23), sampler=sampler,
        operations=[dl.MapTransform(first_op), *LAYOUTS[name]()], worker_count=worker_count, **kw,
    )


def states_after(loader, steps: int) -> tuple[list, list[dict]]:
    it = iter(loader)
    outputs, states = [], []
    try:
        for x in itertools.islice(it, steps):
            outputs.append(x)
            states.append(json.loads(json.dumps(it.get_state())))
    finally:
        it.close()
    return outputs, states


def pids(path) -> set[int]:
    return {int(line) for line in open(path).read().split()} if os.path.exists(path) else set()


@pytest.mark.parametrize("name", sorted(LAYOUTS))
@pytest.mark.parametrize("how", ["iterator", "set_state"])
def test_with_workers_the_restore_check_runs_no_operation_in_the_training_process(tmp_path, name, how):
    log = str(tmp_path / "pids")
    loader = layout_loader(name, RecordPid(log))
    _, states = states_after(loader, 7)
    os.remove(log)
    if how == "iterator":
        it = loader.iterator(states[-1])  # the check runs here, before any next()
    else:
        it = iter(loader)
        next(it)
        os.remove(log)
        it.set_state(states[-1])
    try:
        ran = pids(log)
        assert ran, "the check recomputed the step somewhere"
        assert os.getpid() not in ran
    finally:
        it.close()


def test_with_workers_an_elastic_restore_checks_in_worker_processes_too(tmp_path):
    path, log = tmp_path / "data", str(tmp_path / "pids")
    write_records(path, 40)

    def loader(shard, batch):
        sampler = dl.IndexSampler(40, dl.ShardOptions(*shard), shuffle=True, seed=3, num_epochs=2)
        ops = [dl.MapTransform(RecordPid(log)), dl.MapTransform(decode), dl.Batch(batch)]
        return dl.DataLoader(FixedWidthFile(str(path)), sampler, ops, worker_count=2)

    # One old state of another host count (its step is not in the new stream), then
    # every old host's states.
    _, old0 = states_after(loader((0, 2), 4), 3)
    _, old1 = states_after(loader((1, 2), 4), 3)
    for restore in (old1[-1], [old0[-1], old1[-1]]):
        os.remove(log)
        it = loader((0, 1), 8).iterator(restore)
        it.close()
        ran = pids(log)
        assert ran and os.getpid() not in ran


@pytest.mark.parametrize("name", ["batch", "filter_batch", "everything", "flat_map"])
def test_with_workers_every_old_hosts_states_are_checked_on_one_pool(name):
    old = [states_after(make_loader(name, shard=(h, 3)), 2)[1][-1] for h in range(3)]
    it = make_loader(name, worker_count=2).iterator(old)  # one new host checks all three
    try:
        assert next(it) is not None
    finally:
        it.close()
    changed = json.loads(json.dumps(old))
    changed[2]["fingerprint"]["output"] = "0" * 16  # as if the operations had changed
    with pytest.raises(dl.StateMismatchError, match="the operations' output differs"):
        make_loader(name, worker_count=2).iterator(changed)


def test_with_workers_every_old_hosts_states_with_a_rewritten_record_are_refused_naming_it(tmp_path):
    path = tmp_path / "data"
    write_records(path, 40)
    old = [states_after(file_loader(path, shard=(h, 2)), 3)[1][-1] for h in range(2)]
    from dataloader.engine import fingerprint

    record = int(fingerprint.record_keys(file_loader(path).plan, old[1]["fingerprint"])[2])
    write_records(path, 40, changed=record)
    with pytest.raises(dl.StateMismatchError, match=rf"source bytes of record {record} \(1 of the 4 records"):
        file_loader(path, worker_count=2).iterator(old)


def test_with_workers_a_changed_map_or_record_is_still_refused(tmp_path):
    path = tmp_path / "data"
    write_records(path, 40)
    _, states = states_after(file_loader(path, worker_count=2), 5)
    with pytest.raises(dl.StateMismatchError, match="the operations' output differs"):
        file_loader(path, factor=2, worker_count=2).iterator(states[-1])
    it = iter(file_loader(path, factor=2, worker_count=2))
    try:
        with pytest.raises(dl.StateMismatchError, match="the operations' output differs"):
            it.set_state(states[-1])
    finally:
        it.close()
    from dataloader.engine import fingerprint

    record = fingerprint.record_keys(file_loader(path).plan, states[-1]["fingerprint"])[1]
    write_records(path, 40, changed=int(record))
    with pytest.raises(dl.StateMismatchError, match=rf"source bytes of record {record} \(1 of the 4 records of step 5\)"):
        file_loader(path, worker_count=2).iterator(states[-1])


def test_a_refused_set_state_with_workers_leaves_the_iterator_where_it_was(tmp_path):
    path = tmp_path / "data"
    write_records(path, 40)
    _, states = states_after(file_loader(path, worker_count=2), 5)
    expected, _ = states_after(file_loader(path, factor=2, worker_count=2), 6)
    it = iter(file_loader(path, factor=2, worker_count=2))
    try:
        first = next(it)
        with pytest.raises(dl.StateMismatchError):
            it.set_state(states[-1])
        assert_streams_equal([first, *itertools.islice(it, 5)], expected)
    finally:
        it.close()


@pytest.mark.parametrize(
    "name", ["batch", "filter", "flat_map", "filter_batch", "everything", "batch_then_flat_map"]
)
def test_with_workers_a_checked_restore_gives_the_same_batches_and_states_as_an_unchecked_one(name):
    _, states = states_after(make_loader(name), 16)
    for k in range(0, len(states) - 1, 3):
        steps = min(5, len(states) - 1 - k)
        outs = {}
        for verify in (True, False):
            it = make_loader(name, worker_count=2, verify_on_restore=verify).iterator(states[k])
            try:
                assert it.get_state() == states[k]
                got = []
                for _ in range(steps):
                    got.append(next(it))
                    got.append(json.loads(json.dumps(it.get_state())))
                outs[verify] = got
            finally:
                it.close()
        assert_streams_equal(outs[True][0::2], outs[False][0::2])
        assert outs[True][1::2] == outs[False][1::2] == states[k + 1 : k + 1 + steps], f"restored at {k}"


@pytest.mark.parametrize("name", ["batch", "regroup", "elements"])
def test_a_worker_killed_during_the_check_is_recovered(tmp_path, name):
    flag = str(tmp_path / "kill")
    loader = layout_loader(name, KillOnce(flag))
    outputs, states = states_after(loader, 10)
    open(flag, "w").close()
    it = loader.iterator(states[4])  # the first unit of the check kills its worker
    try:
        assert not os.path.exists(flag), "the check ran the map"
        assert_streams_equal(list(itertools.islice(it, 5)), outputs[5:10])
        assert json.loads(json.dumps(it.get_state())) == states[9]
    finally:
        it.close()
