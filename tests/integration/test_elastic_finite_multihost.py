"""Elastic restore of an ``end="pad"`` loader across real JAX processes, through Orbax
(``elastic_multihost_main.py --pipeline "end pad"``).

Two processes, whose filter keeps different shares of their shards, take some steps
(before or inside the shortest one's padded tail) and save; three processes restore
from every file of that step and run to the end. The three must end on one step (they
agree anew through JAX's key-value store), and every record that passes the filter is
used exactly once over the whole run, padding rows masked.
"""

from __future__ import annotations

import os

import pytest

from tests.integration.cluster import ROOT, finish, start
from tests.integration.finite_multihost_main import BATCH, RECORDS, keep

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess, pytest.mark.timeout(300)]

SCRIPT = os.path.join(ROOT, "tests", "integration", "elastic_multihost_main.py")


def steps_alone(host: int, hosts: int) -> int:
    return -(-sum(1 for x in range(host, RECORDS, hosts) if keep({"record": x})) // BATCH)


def test_the_processes_differ_without_padding():
    assert len({steps_alone(h, 2) for h in range(2)}) > 1


@pytest.mark.parametrize("save", [2, min(steps_alone(h, 2) for h in range(2)) + 1], ids=["mid-run", "in a padded tail"])
def test_two_then_three_processes_end_together_with_every_record_once(tmp_path, save):
    ckpt = str(tmp_path / "ckpt")
    run = ("--pipeline", "end pad", "--ckpt", ckpt)
    before = finish(start(SCRIPT, 2, tmp_path, "two", *run, "--steps", str(save), "--save", str(save)))
    after = finish(start(SCRIPT, 3, tmp_path, "three", *run, "--restore", str(save), "--steps", "-1"))
    assert [r["steps"] for r in before] == [save, save]
    assert len({r["steps"] for r in after}) == 1 and after[0]["steps"] > 0  # one end for all three
    assert all("elastic" in str(r["state"]) for r in after)
    used = sorted(x for r in before + after for x in r["ids"])
    assert used == [x for x in range(RECORDS) if keep({"record": x})]
