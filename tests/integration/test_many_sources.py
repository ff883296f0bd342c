"""A mixture of 4,096 file sources (ArrayRecord, JSON Lines) under ``ulimit -n 1024``:
every process keeps at most a bounded number of files open, and the batches are those of
an in-process run.

The child script lowers its soft ``RLIMIT_NOFILE`` to 1,024 (as a default shell has it)
before anything starts, so the fork server and the workers inherit it. Each record's map
runs in the process that computes it and counts ``/proc/self/fd`` there, so the batches
carry the worst count of every worker; the trainer counts its own after every batch.

An ArrayRecord file takes at least 128 KiB (two 64 KiB blocks) however few its records,
so the 4,096 ArrayRecord sources are 4,096 paths over 512 distinct files (hard links, 8
per file): a path is a file of its own to the sources and to the cache of open files (each
path is opened on its own), and the disk holds 64 MiB instead of 512. The JSON Lines
sources are 4,096 files of their own.
"""

from __future__ import annotations

import json

import pytest

from tests.helpers import python_script

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess, pytest.mark.timeout(300)]

SCRIPT = """
import json, os, resource, sys
import numpy as np

resource.setrlimit(resource.RLIMIT_NOFILE, (1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
import dataloader as dl

folder, kind, sources, distinct, records = {folder!r}, {kind!r}, 4096, 512, 8
paths = []
if kind == "array_record":
    for f in range(distinct):
        path = os.path.join(folder, f"f{{f:04d}}.array_record")
        dl.write_array_record(path, [b"%d:%d" % (f, r) for r in range(records)])
    for s in range(sources):
        path = os.path.join(folder, f"s{{s:04d}}.array_record")
        os.link(os.path.join(folder, f"f{{s % distinct:04d}}.array_record"), path)
        paths.append(path)
else:  # JSON Lines files are small: 4,096 of their own
    for s in range(sources):
        path = os.path.join(folder, f"s{{s:04d}}.jsonl")
        with open(path, "w") as out:
            out.writelines(f'"{{s}}:{{r}}"\\n' for r in range(records))
        paths.append(path)


def source(path):
    if kind == "array_record":
        return dl.ArrayRecordDataSource(path)
    return dl.JsonlDataSource(path, parse="bytes", index=False)


def descriptors():
    return len(os.listdir("/proc/self/fd"))


def tagged(record):  # runs where the record is computed: a worker, or the trainer
    return np.frombuffer(record.ljust(12, b" "), np.uint8), descriptors()


def pipeline():
    components = [dl.MapDataset.source(source(p)) for p in paths]
    weights = [1 + (i % 3) for i in range(sources)]  # unequal
    return dl.MapDataset.mix(components, weights).map(tagged).batch(32).to_iter_dataset()


def run(workers):
    ds = pipeline()
    if workers:
        ds = ds.mp_prefetch(dl.MultiprocessingOptions(num_workers=workers))
    out, trainer, computed = [], 0, 0
    iterator = iter(ds)
    for _ in range(300):
        records, counts = next(iterator)
        out.append(records.copy())  # a copy: a batch held keeps its shared memory open
        trainer, computed = max(trainer, descriptors()), max(computed, int(counts.max()))
    return out, trainer, computed


serial, trainer_0, computed_0 = run(0)
pooled, trainer_2, computed_2 = run(2)
print(json.dumps({{
    "limit": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
    "equal": len(serial) == len(pooled) == 300 and all(
        np.array_equal(a, b) for a, b in zip(serial, pooled)),
    "sources_read": len(np.unique(dl.MixSchedule([1 + (i % 3) for i in range(sources)]).locate(
        np.arange(300 * 32))[0])),
    "trainer_0": trainer_0, "trainer_2": trainer_2, "workers": computed_2,
}}))
"""


@pytest.mark.parametrize("kind", ["array_record", "jsonl"])
def test_a_mixture_of_4096_sources_runs_under_ulimit_1024_with_few_descriptors(tmp_path, kind):
    with python_script(SCRIPT.format(folder=str(tmp_path), kind=kind)) as proc:
        out, err = proc.communicate(timeout=280)
    assert proc.returncode == 0, err[-3000:]
    found = json.loads(out.strip().splitlines()[-1])
    assert found["limit"] == 1024
    assert found["equal"], "the batches of 2 workers differ from the in-process run's"
    # Far more sources were read than a process keeps open.
    assert found["sources_read"] > 4000
    assert found["trainer_0"] <= 256, found  # reading in the trainer itself
    assert found["trainer_2"] <= 256, found
    assert found["workers"] <= 256, found
