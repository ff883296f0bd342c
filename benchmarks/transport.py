"""The pool's result transport: batches of numpy arrays from 2 workers to the trainer.

Each worker makes batches of ``8`` records of ``--sizes`` bytes each (one ``np.full``
per record, next to no compute), so the time measured is the pool's: dispatch, the
result's way back (shared memory, or the pipe) and reordering. The trainer does not
touch the arrays (a zero-copy transport is what is measured, not a copy loop).

For each batch size it reports the time to the first batch from ``iter()`` (workers
start, the first results are sized) and, from then on, batches for ``--seconds``:
rows/s and MB/s. Every row runs in a fresh interpreter. ``--tree NAME=PATH`` (repeat
it) runs the same rows against other checkouts of the project, e.g. the code before a
change, side by side in one run (``PYTHONPATH=PATH``: the checkout's ``sources``,
``samplers`` and ``operations`` must import as ``dataloader.*`` from there, e.g. links
``dataloader/sources -> ../sources``); rows take turns, ``--repeat`` times, medians shown.
Run it under a 64 MB ``/dev/shm`` (Docker's default) as root with ``unshare --mount
sh -c 'mount -t tmpfs -o size=64m tmpfs /dev/shm && python3 benchmarks/transport.py'``.

    python3 benchmarks/transport.py
    python3 benchmarks/transport.py --tree before=/tmp/before --tree after=. --repeat 3
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from bench_env import run_in_tree, side_by_side

RECORDS_PER_BATCH = 8


def make_record(i: int, nbytes: int) -> dict:
    return {"x": np.full(nbytes, i % 251, np.uint8), "id": np.int64(i)}


def measure(record_bytes: int, seconds: float) -> dict:
    """One row, in this interpreter: the first batch's latency, then throughput."""
    import functools

    import dataloader as dl

    n = 10**7
    loader = dl.DataLoader(
        dl.RangeDataSource(n),
        dl.SequentialSampler(n),
        [dl.MapTransform(functools.partial(make_record, nbytes=record_bytes)), dl.Batch(RECORDS_PER_BATCH)],
        worker_count=2,
        warm_start=False,
    )
    began = time.perf_counter()
    it = iter(loader)
    next(it)
    first = time.perf_counter() - began
    batches, began = 0, time.perf_counter()
    while time.perf_counter() - began < seconds:
        batch = next(it)
        batches += 1
    elapsed = time.perf_counter() - began
    assert batch["x"].shape == (RECORDS_PER_BATCH, record_bytes)
    it.close()
    rows = batches * RECORDS_PER_BATCH / elapsed
    return {"first_s": first, "rows_s": rows, "mb_s": rows * record_bytes / 1e6}


def _row(tree: str, record_bytes: int, seconds: float) -> dict:
    return run_in_tree(__file__, tree, ["--child", str(record_bytes), "--seconds", str(seconds)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1048576,8192", help="bytes per record (8 per batch): 8 MB and 64 KB batches")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--repeat", type=int, default=1)
    parsed = side_by_side(parser, lambda a: measure(a.child, a.seconds), child_type=int)
    if parsed is None:
        return
    args, trees = parsed
    sizes = [int(s) for s in args.sizes.split(",")]
    results: dict[tuple[str, int], list[dict]] = {}
    for _ in range(args.repeat):
        for size in sizes:
            for name, path in trees:
                results.setdefault((name, size), []).append(_row(path, size, args.seconds))
    print(f"{'batch':>9} {'tree':>8} {'first batch':>12} {'rows/s':>10} {'MB/s':>9}")
    for size in sizes:
        for name, _ in trees:
            runs = results[(name, size)]
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            batch = size * RECORDS_PER_BATCH
            label = f"{batch / 2**20:.0f} MiB" if batch >= 2**20 else f"{batch / 2**10:.0f} KiB"
            print(f"{label:>9} {name:>8} {med['first_s'] * 1000:>9.0f} ms {med['rows_s']:>10.0f} {med['mb_s']:>9.0f}")


if __name__ == "__main__":
    main()
