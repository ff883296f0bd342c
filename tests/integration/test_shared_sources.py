"""An in-memory source costs its size once for the whole process tree, whatever the
number of workers (issue: a 400 MB array read by 2 workers cost the tree 2.4 GB)."""

from __future__ import annotations

import numpy as np
import pytest

import dataloader as dl
from tests.helpers import assert_streams_equal
from tests.integration.conftest import child_pids


def _pss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    return 0


def tree_pss() -> int:
    """PSS of this process and its worker children: shared pages counted once in all."""
    import os

    return _pss_bytes(os.getpid()) + sum(_pss_bytes(pid) for pid in child_pids())


def row_sums(row):
    return float(row.sum())


def _run(array: np.ndarray, workers: int) -> tuple[list, int]:
    loader = dl.DataLoader(
        dl.InMemoryDataSource(array), dl.IndexSampler(len(array), shuffle=True, seed=1, num_epochs=1),
        [dl.MapTransform(row_sums), dl.Batch(100)], worker_count=workers, warm_start=False)
    it = iter(loader)
    batches = [next(it) for _ in range(len(array) // 100)]  # every row read by some worker
    peak = tree_pss()
    it.close()
    return batches, peak


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_two_workers_share_one_copy_of_an_in_memory_array():
    big = np.random.default_rng(0).random((4000, 4096))  # 125 MiB
    small = big[:40].copy()
    with_big, pss_big = _run(big, workers=2)
    _, pss_small = _run(np.tile(small, (10, 1)), workers=2)  # 400 rows: the same processes, no big array
    extra = pss_big - pss_small
    # The parent's array plus what the workers add for it: about one copy, not three.
    assert extra < 1.4 * big.nbytes, f"the tree holds {extra / big.nbytes:.2f} copies of the array"
    in_process, _ = _run(big, workers=0)
    assert_streams_equal(with_big, in_process)
