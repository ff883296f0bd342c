"""Elastic restore across real JAX processes, through Orbax: 2 -> 3 -> 1 processes.

Two processes take some steps and save with Orbax; three processes restore from every
file of that checkpoint step, take steps and save again; one process restores from the
three files and runs to the end of the one-epoch stream. Every record id of the whole
run must be used exactly once.
"""

from __future__ import annotations

import os

import pytest

from tests.dataloader.engine.elastic_cases import reference
from tests.integration.cluster import ROOT, finish, start

SCRIPT = os.path.join(ROOT, "tests", "integration", "elastic_multihost_main.py")


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(400)
@pytest.mark.parametrize("pipeline", ["filter", "flat map, first-fit"])
def test_two_then_three_then_one_process_use_every_record_once(tmp_path, pipeline):
    ckpt = str(tmp_path / "ckpt")
    phases = [
        (2, ["--steps", "3", "--save", "3"]),
        (3, ["--restore", "3", "--steps", "2", "--save", "5"]),
        (1, ["--restore", "5", "--steps", "-1"]),
    ]
    used: list[int] = []
    for i, (processes, extra) in enumerate(phases):
        reports = finish(start(SCRIPT, processes, tmp_path, f"phase{i}", "--pipeline", pipeline,
                               "--ckpt", ckpt, *extra))
        assert len(reports) == processes
        if i:
            assert all("elastic" in str(r["state"]) for r in reports)
        used += [x for r in reports for x in r["ids"]]
    assert sorted(used) == reference(pipeline)
    files = sorted(p.name for p in (tmp_path / "ckpt" / "5" / "data").glob("*.json"))
    assert files == [f"process_{i}-of-3.json" for i in range(3)]
