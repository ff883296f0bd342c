"""What it costs per step for hosts to agree where finite data ends (``end="pad"``).

Starts a local JAX cluster of ``--processes`` processes on CPU (the coordinator on
127.0.0.1) and times, in each process, the same filtered pipeline read to its end
(``num_epochs=1``, small batches of small records, so that the agreement is a visible
share of a step) in several ways:

* ``none``: ``end=None``, each process alone (what a single host pays; across hosts it
  would hang at the end);
* ``lookahead=L``: ``end=dl.PadEnd(lookahead=L)``, the step count agreed through JAX's
  key-value store every ``L`` steps (1: at every step);
* ``allgather``: the way ``EvalBatches`` agreed before it became ``end="pad"``, one ``multihost_utils.process_allgather`` of a
  flag at every step (a device collective).

Process 0 prints one row per way: steps, steps/s (the slowest process's) and the
added microseconds per step against ``none``.

    python benchmarks/finite_end.py [--processes 2] [--records 200000] [--batch 8]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WAYS = ["none", "lookahead=1", "lookahead=8", "lookahead=32", "allgather"]


def keep(x: int) -> bool:
    return x % 5 != 0


def loader(records: int, batch: int, end):
    import dataloader as dl

    return dl.DataLoader(
        dl.RangeDataSource(records),
        dl.IndexSampler(records, dl.ShardByJaxProcess(), num_epochs=1),
        [dl.FilterTransform(keep), dl.MapTransform(lambda x: {"x": np.int64(x)}), dl.Batch(batch)],
        read_options=dl.ReadOptions(unit_size=1024), end=end,
    )


class AllGatherEveryStep:
    """EvalBatches' former agreement: one device all-gather of a 'still has a batch' flag a step."""

    def __init__(self, it) -> None:
        self._it, self._done = it, False

    def __iter__(self):
        return self

    def __next__(self):
        from jax.experimental import multihost_utils

        batch = None
        if not self._done:
            try:
                batch = next(self._it)
            except StopIteration:
                self._done = True
        flags = multihost_utils.process_allgather(np.asarray([int(batch is not None)], np.int32))
        if not np.asarray(flags).any():
            raise StopIteration
        return batch


def time_way(way: str, records: int, batch: int) -> tuple[int, float]:
    from jax.experimental import multihost_utils

    import dataloader as dl

    if way == "none" or way == "allgather":
        it = iter(loader(records, batch, None))
        if way == "allgather":
            it = AllGatherEveryStep(it)
    else:
        it = iter(loader(records, batch, dl.PadEnd(lookahead=int(way.split("=")[1]))))
    multihost_utils.sync_global_devices(f"start {way}")  # every process starts together
    start, steps = time.perf_counter(), 0
    for _ in it:
        steps += 1
    return steps, time.perf_counter() - start


def child(args) -> None:
    import jax

    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{args.port}",
                               num_processes=args.processes, process_id=args.process_id,
                               initialization_timeout=60)
    rows = {}
    for way in WAYS:
        time_way(way, args.records // 20, args.batch)  # warm-up: compilation, first exchanges
        rows[way] = time_way(way, args.records, args.batch)
    with open(args.out, "w") as f:
        json.dump(rows, f)
    jax.distributed.shutdown()


def parent(args) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
    env.pop("XLA_FLAGS", None)
    with tempfile.TemporaryDirectory() as tmp:
        outs = [os.path.join(tmp, f"{i}.json") for i in range(args.processes)]
        procs = [subprocess.Popen([sys.executable, __file__, "--child", "--process-id", str(i),
                                   "--processes", str(args.processes), "--port", str(port),
                                   "--records", str(args.records), "--batch", str(args.batch),
                                   "--out", outs[i]], env=env, cwd=ROOT)
                 for i in range(args.processes)]
        try:
            for p in procs:
                p.wait(timeout=600)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        if any(p.returncode for p in procs):
            raise SystemExit("a process failed")
        reports = []
        for out in outs:
            with open(out) as f:
                reports.append(json.load(f))
    print(f"{args.processes} processes on CPU, {args.records} records, filter keeps 4/5, "
          f"batch {args.batch} per process, one epoch")
    print(f"{'way':<14}{'steps':>8}{'steps/s':>10}{'us/step added':>15}")
    base = None
    for way in WAYS:
        steps = [r[way][0] for r in reports]
        seconds = max(r[way][1] for r in reports)
        per_step = seconds / max(steps)
        if base is None:
            base = per_step
        print(f"{way:<14}{'/'.join(map(str, steps)):>8}{max(steps) / seconds:>10.0f}"
              f"{(per_step - base) * 1e6:>15.1f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--process-id", type=int, default=0)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    (child if args.child else parent)(args)


if __name__ == "__main__":
    main()
