"""An in-memory source costs its size once for the whole process tree, whatever the
number of workers (issue: a 400 MB array read by 2 workers cost the tree 2.4 GB)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import dataloader as dl
from tests.helpers import assert_streams_equal, python_script
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


_HANDED_OVER = """
    import gc, json, os
    import numpy as np
    import dataloader as dl

    def tree_pss():
        parents = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as f:
                        parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
                except OSError:
                    pass
        tree, frontier = {os.getpid()}, {os.getpid()}
        while frontier:
            frontier = {p for p, parent in parents.items() if parent in frontier} - tree
            tree |= frontier
        total = 0
        for pid in tree:
            try:
                with open(f"/proc/{pid}/smaps_rollup") as f:
                    total += next(int(line.split()[1]) * 1024 for line in f if line.startswith("Pss:"))
            except (OSError, StopIteration):
                pass
        return total

    def row_sum(row):
        return float(row.sum())

    rows = ROWS  # set by the test
    array = np.random.default_rng(0).random((rows, 4096))  # 32 KiB a row
    nbytes = array.nbytes
    source = dl.InMemoryDataSource(array)
    del array  # handed over: the caller keeps no reference
    loader = dl.DataLoader(source, dl.IndexSampler(rows, shuffle=True, seed=1, num_epochs=1),
                           [dl.MapTransform(row_sum), dl.Batch(max(1, rows // 100))], worker_count=2)
    it = iter(loader)
    read = sum(len(b) for b in it)  # every row, so every page, read by some worker
    gc.collect()
    print(json.dumps({"pss": tree_pss(), "nbytes": nbytes, "read": read}))
    it.close()
"""


def _tree_pss_with(rows: int) -> dict:
    with python_script(_HANDED_OVER.replace("ROWS", str(rows))) as proc:
        assert proc.wait(150) == 0, proc.stderr.read()
        return json.loads(proc.stdout.read())


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_an_array_handed_over_costs_the_tree_its_size_once():
    """InMemoryDataSource(array) then ``del array``, 2 workers from the fork server: the
    training process, the server and the workers together hold the array once (it cost
    twice its size when the source kept the array after copying it for the workers).
    PSS of the script's own tree: other processes on the machine do not change it."""
    baseline = _tree_pss_with(32)  # 1 MiB: the same interpreters and pipeline, no array to speak of
    big = _tree_pss_with(8192)  # 256 MiB
    assert big["read"] == 8192 and baseline["read"] == 32
    extra = big["pss"] - baseline["pss"]
    assert extra <= 1.15 * big["nbytes"], (
        f"the tree holds {extra / big['nbytes']:.2f} copies of the array "
        f"({big['pss'] / 2**20:.0f} MiB against {baseline['pss'] / 2**20:.0f} MiB without it)")


_SMALL_SHM = """
    import json, pickle
    import numpy as np
    import dataloader as dl

    def row_sum(row):
        return float(row.sum())

    array = np.arange(2048 * 1024, dtype=np.float64).reshape(2048, 1024)  # 16 MiB
    expected = array.sum(axis=1).tolist()
    try:
        dl.SharedMemoryDataSource(array)
        named = "made"
    except OSError as exc:
        named = str(exc)
    loader = dl.DataLoader(dl.InMemoryDataSource(array), dl.SequentialSampler(2048),
                           [dl.MapTransform(row_sum), dl.Batch(256)], worker_count=2)
    got = [x for b in loader for x in b.tolist()]
    print(json.dumps({"named": named, "right": got == expected}))
"""


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_an_in_memory_array_needs_no_room_in_dev_shm_and_a_named_block_says_it_does():
    """Under a 1 MiB /dev/shm (Docker's is 64 MiB) a 16 MiB array still reaches 2 workers
    through an InMemoryDataSource (a memfd), and a SharedMemoryDataSource refuses with the
    error that names /dev/shm: a real full file system, in a mount namespace of its own."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare to mount a small /dev/shm in a namespace of its own")
    command = ("mount -t tmpfs -o size=1m tmpfs /dev/shm && exec " + shlex.quote(sys.executable)
               + " -c " + shlex.quote(textwrap.dedent(_SMALL_SHM)))
    out = subprocess.run(["unshare", "--mount", "sh", "-c", command], capture_output=True, text=True,
                         timeout=100, cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    if out.returncode and "mount" in out.stderr and "Traceback" not in out.stderr:
        pytest.skip(f"cannot mount a tmpfs here: {out.stderr.strip()}")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["right"]
    assert re.match(r"\[Errno 28\] /dev/shm has no room for a shared-memory block of 16\.0 MiB "
                    r"\(1\.0 MiB free of 1 MiB\): .*--shm-size.*InMemoryDataSource\(array\)", result["named"]), result["named"]
