"""Finite filtered data ends on the same step on 2 and 3 JAX processes (``end="pad"``).

Each process (``finite_multihost_main.py``) keeps a different share of its shard, so
alone the processes would run different numbers of steps (and a global array would
hang at the first step one of them lacks). With ``end="pad"`` they agree on the step
count through JAX's key-value store, from the device feed's reader thread.
"""

from __future__ import annotations

import os

import pytest

from tests.integration import cluster
from tests.integration.finite_multihost_main import BATCH, RECORDS, keep

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.timeout(240)]

SCRIPT = os.path.join(cluster.ROOT, "tests", "integration", "finite_multihost_main.py")


def survivors(host: int, hosts: int) -> list[int]:
    return [x for x in range(host, RECORDS, hosts) if keep({"record": x})]


def save_after(hosts: int) -> int:
    """A step at which the shortest process already pads: the restore starts in its tail."""
    return min(-(-len(survivors(h, hosts)) // BATCH) for h in range(hosts)) + 1


@pytest.fixture(scope="module", params=[2, 3])
def run(request, tmp_path_factory):
    hosts = request.param
    out = tmp_path_factory.mktemp(f"finite{hosts}")
    reports = cluster.finish(cluster.start(SCRIPT, hosts, out, "run", "--save-after", str(save_after(hosts))))
    return hosts, reports


def rows_of(step: dict) -> list[tuple[int, int, bool]]:
    records, masks = dict(map(tuple, step["record"])), dict(map(tuple, step["mask"]))
    assert records.keys() == masks.keys()
    return [(row, records[row], masks[row]) for row in sorted(records)]


def test_the_processes_differ_without_padding():
    for hosts in (2, 3):
        counts = {-(-len(survivors(h, hosts)) // BATCH) for h in range(hosts)}
        assert len(counts) > 1, "the filter must leave the processes different step counts"


def test_every_process_runs_the_longest_process_s_steps(run):
    hosts, reports = run
    longest = max(-(-len(survivors(h, hosts)) // BATCH) for h in range(hosts))
    assert [len(r["steps"]) for r in reports] == [longest] * hosts


def test_every_surviving_record_appears_once_and_padding_is_masked(run):
    hosts, reports = run
    seen = []
    for report in reports:
        for step in report["steps"]:
            rows = rows_of(step)
            assert len(rows) == BATCH  # this process's rows of the global batch
            for _, record, real in rows:
                if real:
                    seen.append(record)
                else:
                    assert record == 0, "a padding row is not zero"
    expected = sorted(x for h in range(hosts) for x in survivors(h, hosts))
    assert sorted(seen) == expected


def test_each_process_reads_its_own_survivors_in_order(run):
    hosts, reports = run
    for h, report in enumerate(reports):
        real = [rec for step in report["steps"] for _, rec, m in rows_of(step) if m]
        assert real == survivors(h, hosts)


def test_a_restore_in_the_padded_tail_continues_with_the_same_steps(run):
    hosts, reports = run
    k = save_after(hosts)
    for report in reports:
        assert report["restored"] == report["steps"][k:]
    shortest = min(range(hosts), key=lambda h: len(survivors(h, hosts)))
    assert reports[shortest]["state"]["end_padded"] >= 1
