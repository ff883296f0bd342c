"""Multi-host on JAX's own runtime: 1, 2 and 3 local processes over CPU devices.

Each process (``multihost_main.py``) joins ``jax.distributed``, reads its shard with
``ShardByJaxProcess`` and feeds a device iterator over a mesh of all processes'
devices, so every batch is one global ``jax.Array``. Processes report the slices of
the global arrays they hold; this test stitches them together. The global batch stays
12 records: 6 per process on 2 hosts, 4 on 3 hosts, 12 on 1.
"""

from __future__ import annotations

import json
import os

import pytest

import dataloader as dl
from tests.integration import cluster
from tests.integration.cluster import finish
from tests.integration.multihost_main import LOCAL_DEVICES, RECORDS, to_leaves

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.timeout(240)]

SCRIPT = os.path.join(cluster.ROOT, "tests", "integration", "multihost_main.py")
GLOBAL_BATCH = 12
SAVE_AFTER = 3


def start(hosts: int, out_dir, tag: str, *extra: str) -> cluster.Started:
    """Starts one JAX cluster of ``hosts`` processes, each with its share of the global batch."""
    return cluster.start(SCRIPT, hosts, out_dir, tag, "--batch", str(GLOBAL_BATCH // hosts), *extra)


def global_batches(reports: list[dict], key: str) -> list[list[int]]:
    """Stitches each global batch from the processes' slices, checking they tile it."""
    count = len(reports[0][key])
    assert all(len(r[key]) == count for r in reports), "processes saw different numbers of batches"
    batches = []
    for k in range(count):
        records: dict[int, int] = {}
        for report in reports:
            slices = dict((start, values) for start, values in report[key][k]["record"])
            pairs = dict((start, values) for start, values in report[key][k]["pair"])
            for start, values in slices.items():
                assert pairs[start] == [[x, -x] for x in values], "leaves out of step"
                for offset, value in enumerate(values):
                    assert start + offset not in records, f"row {start + offset} held twice"
                    records[start + offset] = value
        assert sorted(records) == list(range(GLOBAL_BATCH)), f"batch {k} is not tiled"
        batches.append([records[i] for i in range(GLOBAL_BATCH)])
    return batches


def as_sets(batches):
    return [sorted(b) for b in batches]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two hosts read an epoch and save a state; then 3 hosts and 1 host restore it."""
    out = tmp_path_factory.mktemp("multihost")
    two = finish(start(2, out, "two", "--save-after", str(SAVE_AFTER)))
    state_path = out / "state.json"
    state_path.write_text(json.dumps(two[0]["state"]))
    three = start(3, out, "three", "--restore", str(state_path))
    one = start(1, out, "one", "--restore", str(state_path), "--skip-epoch")
    return {"two": two, "three": finish(three), "one": finish(one)}


@pytest.fixture(scope="module")
def single_process_batches():
    """One process reading with batch B*H, without JAX: the reference global batches."""
    loader = dl.DataLoader(
        dl.RangeDataSource(RECORDS),
        dl.IndexSampler(RECORDS, shuffle=True, num_epochs=1, seed=5),
        [dl.MapTransform(to_leaves), dl.Batch(GLOBAL_BATCH, drop_remainder=True)],
    )
    return [b["record"].tolist() for b in loader]


@pytest.mark.parametrize("hosts", ["two", "three"])
def test_each_process_is_one_jax_process_of_a_global_mesh(runs, hosts):
    reports = runs[hosts]
    assert [r["process_index"] for r in reports] == list(range(len(reports)))
    for r in reports:
        assert r["process_count"] == len(reports)
        assert r["device_count"] == LOCAL_DEVICES * len(reports)
        assert r["global_shape"] == [GLOBAL_BATCH]
        assert r["fully_addressable"] is False and r["same_sharding"] is True


@pytest.mark.parametrize("hosts", ["two", "three"])
def test_an_epoch_reads_every_record_exactly_once_across_processes(runs, hosts):
    records = [x for batch in global_batches(runs[hosts], "epoch") for x in batch]
    assert sorted(records) == list(range(RECORDS))


@pytest.mark.parametrize("hosts", ["two", "three"])
def test_global_batches_equal_one_process_reading_batch_b_times_h(
    runs, hosts, single_process_batches
):
    assert as_sets(global_batches(runs[hosts], "epoch")) == as_sets(single_process_batches)


def test_the_processes_save_the_same_position_at_a_global_batch_boundary(runs):
    states = [r["state"] for r in runs["two"]]
    assert [s["position"] for s in states] == [SAVE_AFTER * GLOBAL_BATCH // 2] * 2
    assert [s["made_for"]["shard_index"] for s in states] == [0, 1]


@pytest.mark.parametrize("hosts", ["three", "one"])
def test_a_state_saved_by_two_processes_restores_on_other_process_counts(
    runs, hosts, single_process_batches
):
    continued = as_sets(global_batches(runs["two"], "epoch")[SAVE_AFTER:])
    restored = as_sets(global_batches(runs[hosts], "restored"))
    assert restored == continued == as_sets(single_process_batches[SAVE_AFTER:])
