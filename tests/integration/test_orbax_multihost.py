"""Two real JAX processes save the loader's state with Orbax; one process restores it."""

from __future__ import annotations

import json
import os

import numpy as np
import orbax.checkpoint as ocp
import pytest

import dataloader as dl
from tests.integration.cluster import ROOT, finish, start

SCRIPT = os.path.join(ROOT, "tests", "integration", "orbax_multihost_main.py")
BATCHES = 3


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Runs the two processes once; returns the checkpoint directory and their reports."""
    tmp = tmp_path_factory.mktemp("orbax_multihost")
    reports = finish(start(SCRIPT, 2, tmp, "p", "--batches", str(BATCHES), "--ckpt", str(tmp / "ckpt")))
    return tmp / "ckpt", reports


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_each_process_writes_its_state_under_its_index_and_count(saved):
    ckpt, reports = saved
    data = ckpt / str(BATCHES) / "data"
    assert sorted(p.name for p in data.glob("*.json")) == ["process_0-of-2.json", "process_1-of-2.json"]
    for i, report in enumerate(reports):
        assert json.loads((data / f"process_{i}-of-2.json").read_text()) == report["state"]


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_one_process_restores_the_two_process_checkpoint_elastically(saved):
    """Process 0 of 1 has no file of its own: it reads process_0-of-2.json, at batch 8."""
    ckpt, reports = saved
    sampler = dl.IndexSampler(64, shuffle=True, num_epochs=1, seed=9)
    loader = dl.DataLoader(dl.RangeDataSource(64), sampler, [dl.Batch(8, drop_remainder=True)])
    with ocp.CheckpointManager(ckpt) as mngr:
        restored = mngr.restore(BATCHES, args=ocp.args.Composite(data=dl.CheckpointRestore(iter(loader))))
    single = [sorted(b.tolist()) for b in restored.data]
    two = [sorted(np.concatenate(pair).tolist()) for pair in zip(reports[0]["next"], reports[1]["next"])]
    assert single == two and len(single) == 64 // 8 - BATCHES
