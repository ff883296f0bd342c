"""The training process's CPU per batch at 2 workers, side by side for several checkouts.

What the consumer's process spends per batch (``time.process_time()``: every thread of
it, the pool's reader thread included) while 2 worker processes compute, for three
pipelines whose per-batch work in the parent differs:

* ``loader``: a ``DataLoader`` with a map and a ``Batch(64)``: the parent only
  reorders units and hands batches out (the engine's own cost).
* ``loader + packer``: a first-fit packer (3 bins of 64 tokens) and a ``Batch(8)`` of
  its rows after the engine: the packer runs in the parent, element by element, and
  names each element's engine tag (what an elastic restore reads).
* ``dataset window shuffle``: ``to_iter_dataset().map(...)`` under a
  ``WindowShuffleIterDataset`` and ``.batch(64)``, with ``mp_prefetch`` (2 workers):
  the window shuffle and the batch run in the parent.

Every row runs in a fresh interpreter, first ``--warmup`` batches untimed, then batches
for ``--seconds``. ``--tree NAME=PATH`` (repeat it) measures other checkouts of the
project in the same run, rows taking turns, ``--repeat`` times, medians shown: the way
to compare a change with the code before it on a small, noisy machine. A checkout needs
``dataloader/samplers``, ``dataloader/sources`` and ``dataloader/operations`` to import
from it (links to ``../samplers`` etc. in an exported copy).

    python3 benchmarks/parent_cpu.py
    python3 benchmarks/parent_cpu.py --tree before=/tmp/before --tree after=. --repeat 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from bench_env import run_in_tree, side_by_side

N = 10**7
ROWS = ("loader", "loader + packer", "dataset window shuffle")


def record(i: int) -> dict:
    return {"x": np.full(16, i % 251, np.int32), "id": np.int64(i)}


def tokens(i: int) -> dict:
    return {"tokens": np.full(1 + i % 23, i % 1000 + 1, np.int32)}


def _iterator(row: str):
    import dataloader as dl

    if row == "loader":
        return iter(dl.DataLoader(dl.RangeDataSource(N), dl.SequentialSampler(N),
                                  [dl.MapTransform(record), dl.Batch(64)], worker_count=2))
    if row == "loader + packer":
        return iter(dl.DataLoader(dl.RangeDataSource(N), dl.SequentialSampler(N),
                                  [dl.MapTransform(tokens), dl.FirstFitPack({"tokens": 64}, num_packing_bins=3),
                                   dl.Batch(8)], worker_count=2))
    stream = dl.MapDataset.range(N).to_iter_dataset().map(record)
    shuffled = dl.experimental.WindowShuffleIterDataset(stream, window_size=256, seed=1).batch(64)
    return iter(shuffled.mp_prefetch(dl.MultiprocessingOptions(num_workers=2)))


def measure(row: str, warmup: int, seconds: float) -> dict:
    """One row, in this interpreter."""
    it = _iterator(row)
    for _ in range(warmup):
        next(it)
    batches, cpu, began = 0, time.process_time(), time.perf_counter()
    while time.perf_counter() - began < seconds:
        next(it)
        batches += 1
    elapsed, cpu = time.perf_counter() - began, time.process_time() - cpu
    it.close()
    return {"cpu_ms_per_batch": 1000 * cpu / batches, "batches_per_s": batches / elapsed}


def _row(tree: str, row: str, args: argparse.Namespace) -> dict:
    return run_in_tree(__file__, tree, ["--child", row, "--seconds", str(args.seconds), "--warmup", str(args.warmup)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    parsed = side_by_side(parser, lambda a: measure(a.child, a.warmup, a.seconds))
    if parsed is None:
        return
    args, trees = parsed
    rows = [r for r in args.rows.split(",") if r]
    results: dict[tuple[str, str], list[dict]] = {}
    started = time.perf_counter()
    for _ in range(args.repeat):
        for row in rows:
            for name, path in trees:
                results.setdefault((row, name), []).append(_row(path, row, args))
    print(f"{'row':<24} {'tree':>8} {'parent CPU ms/batch':>20} {'batches/s':>10}")
    for row in rows:
        for name, _ in trees:
            runs = results[(row, name)]
            cpu = statistics.median(r["cpu_ms_per_batch"] for r in runs)
            rate = statistics.median(r["batches_per_s"] for r in runs)
            print(f"{row:<24} {name:>8} {cpu:>20.3f} {rate:>10.0f}")
    print(f"({args.repeat} runs a row, medians; {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
