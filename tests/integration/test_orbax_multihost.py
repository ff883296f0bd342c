"""Two real JAX processes save the loader's state with Orbax; one process restores it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np
import orbax.checkpoint as ocp
import pytest

import dataloader as dl

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tests", "integration", "orbax_multihost_main.py")
BATCHES = 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Runs the two processes once; returns the checkpoint directory and their reports."""
    tmp = tmp_path_factory.mktemp("orbax_multihost")
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
    port, procs = free_port(), []
    for i in range(2):
        command = [sys.executable, SCRIPT, "--process-id", str(i), "--processes", "2", "--port", str(port),
                   "--batches", str(BATCHES), "--ckpt", str(tmp / "ckpt"), "--out", str(tmp / f"p{i}.json")]
        procs.append(subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    try:
        logs = [proc.communicate(timeout=120)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    for proc, log in zip(procs, logs):
        assert proc.returncode == 0, log[-3000:]
    reports = []
    for i in range(2):
        with open(tmp / f"p{i}.json") as f:
            reports.append(json.load(f))
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
