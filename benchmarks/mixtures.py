"""A mixture of N ArrayRecord sources against one source over the same N files: the
cost per record of mixing, and the files each process holds open.

The data is the issue's case: ``--sources`` files (N) of ``--records`` records of
``--record-bytes`` random bytes each (``group_size:1``, written to a temporary folder).

* ``single source``: ``MapDataset.source(ArrayRecordDataSource(all N files)).seed(0).shuffle()
  .repeat()``: one source, records drawn from every file at random.
* ``mixture``: ``MapDataset.mix([MapDataset.source(ArrayRecordDataSource(file)).repeat() for
  each file], weights)`` with unequal weights (``1 + i % 7``): N sources.

Both then ``map`` (the record's length) and ``batch(32)``. Each row reads ``--batches``
batches after a warm-up of 5, in this process (``worker_count=0``: the cost of mixing is
per-record Python work in the process that computes), median of ``--repeat`` runs, and
prints microseconds per record side by side. The rows run once with the default limit on
open files (128, so N > 128 files are closed and reopened as the reads go round them) and
once with the limit raised above N (every file stays open), which splits the overhead into
the mixture's own and the reopening's.

Then the bytes a source of the mixture takes in a process (its paths, record counts and
node: traced allocations) and pickled to a worker; then both through ``mp_prefetch`` with 2 workers: batches per second, and the most file
descriptors any process held (the trainer, each worker: ``/proc/<pid>/fd``) and the most
of them on data files.

    python benchmarks/mixtures.py
    python benchmarks/mixtures.py --sources 64,512,4096 --batches 300
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import dataloader as dl


def _write(folder: str, count: int, records: int, size: int) -> list[str]:
    rng = np.random.default_rng(0)
    paths = []
    for f in range(count):
        path = os.path.join(folder, f"part-{f:05d}.array_record")
        if not os.path.exists(path):
            dl.write_array_record(path, [rng.bytes(size) for _ in range(records)])
        paths.append(path)
    return paths


def single(paths: list[str]) -> dl.MapDataset:
    return dl.MapDataset.source(dl.ArrayRecordDataSource(paths)).seed(0).shuffle().repeat().map(len).batch(32)


def mixture(paths: list[str]) -> dl.MapDataset:
    components = [dl.MapDataset.source(dl.ArrayRecordDataSource(p)).repeat() for p in paths]
    weights = [1 + i % 7 for i in range(len(paths))]
    return dl.MapDataset.mix(components, weights).map(len).batch(32)


def _per_record_us(build, paths: list[str], batches: int) -> float:
    iterator = iter(build(paths).to_iter_dataset())
    for _ in range(5):
        next(iterator)
    began = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    return (time.perf_counter() - began) / (batches * 32) * 1e6


def _descriptors(pid: int, folder: str) -> tuple[int, int]:
    """(all descriptors, those on files under ``folder``) of process ``pid``."""
    total = data = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        total += 1
        with contextlib.suppress(OSError):
            data += os.readlink(f"/proc/{pid}/fd/{fd}").startswith(folder)
    return total, data


def _children(pid: int) -> list[int]:
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        try:
            with open(f"/proc/{parent}/task/{parent}/children") as f:
                kids = [int(k) for k in f.read().split()]
        except OSError:
            kids = []
        found += kids
        frontier += kids
    return found


def _pooled(build, paths: list[str], batches: int, folder: str) -> tuple[float, int, int, int]:
    """Batches/s with 2 workers, and the most descriptors of the trainer and of a worker,
    and the most on data files in any process."""
    options = dl.MultiprocessingOptions(num_workers=2)
    iterator = iter(build(paths).to_iter_dataset().mp_prefetch(options))
    for _ in range(5):
        next(iterator)
    trainer = worker = data = 0
    began = time.perf_counter()
    for step in range(batches):
        next(iterator)
        if step % 25 == 0 or step == batches - 1:
            mine = _descriptors(os.getpid(), folder)
            trainer, data = max(trainer, mine[0]), max(data, mine[1])
            for child in _children(os.getpid()):
                try:
                    theirs = _descriptors(child, folder)
                except OSError:
                    continue
                worker, data = max(worker, theirs[0]), max(data, theirs[1])
    rate = batches / (time.perf_counter() - began)
    iterator.close()
    return rate, trainer, worker, data


def _footprint(paths: list[str]) -> tuple[float, float]:
    """Bytes a source takes: in this process (traced allocations of building the mixture
    of ``paths``, its sources and nodes), and pickled into each worker."""
    import tracemalloc

    import cloudpickle

    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    ds = mixture(paths).to_iter_dataset()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return held / len(paths), len(cloudpickle.dumps(ds)) / len(paths)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sources", default="64,512,1200", help="numbers of files, comma-separated")
    parser.add_argument("--records", type=int, default=200)
    parser.add_argument("--record-bytes", type=int, default=1024)
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--folder", default=None, help="where the files go (default: a temporary folder)")
    args = parser.parse_args()
    counts = [int(n) for n in args.sources.split(",")]
    default_limit = dl.max_open_files()
    with tempfile.TemporaryDirectory(dir=args.folder) as folder:
        files = _write(folder, max(counts), args.records, args.record_bytes)
        print(f"{args.records} records of {args.record_bytes} B a file, {args.batches} batches of 32, "
              f"in-process (worker_count=0), median of {args.repeat}; us per record")
        print(f"{'files':>6s} {'limit':>6s} {'single source':>14s} {'mixture':>9s} {'mixture - single':>17s}")
        for n in counts:
            for limit in sorted({default_limit, max(default_limit, n + 16)}):
                dl.set_max_open_files(limit)
                rows = {"single": [], "mixture": []}
                for _ in range(args.repeat):
                    for name, build in (("single", single), ("mixture", mixture)):
                        rows[name].append(_per_record_us(build, files[:n], args.batches))
                one, mixed = statistics.median(rows["single"]), statistics.median(rows["mixture"])
                print(f"{n:6d} {limit:6d} {one:14.1f} {mixed:9.1f} {mixed - one:17.1f}")
        dl.set_max_open_files(default_limit)
        print("\nbytes a source of the mixture takes: held in a process (traced), pickled to a worker")
        for n in counts:
            held, pickled = _footprint(files[:n])
            print(f"{n:6d} files {held:8.0f} B held {pickled:6.0f} B pickled")
        print(f"\n2 workers (mp_prefetch), limit {default_limit}: batches/s and the most descriptors held "
              "(all of a process's; on data files, any process)")
        print(f"{'files':>6s} {'source':>8s} {'batches/s':>10s} {'trainer fds':>12s} {'worker fds':>11s} "
              f"{'data fds':>9s}")
        for n in counts:
            for name, build in (("single", single), ("mixture", mixture)):
                rate, trainer, worker, data = _pooled(build, files[:n], args.batches, folder)
                print(f"{n:6d} {name:>8s} {rate:10.1f} {trainer:12d} {worker:11d} {data:9d}")


if __name__ == "__main__":
    main()
