"""What an in-memory array costs the process tree: the trainer, the fork server, 2 workers.

One fresh interpreter per case (so no case inherits another's memory):

* ``baseline``: the same pipeline over a 1 MiB array: the interpreters alone;
* ``handed over``: ``InMemoryDataSource(array)`` then ``del array`` (the caller keeps no
  reference): the source should be the only holder, once for the whole tree;
* ``kept``: the caller keeps its ``array`` beside the source (two copies: the caller's
  and the one the workers share).

Each case reads ``--batches`` batches covering the whole array with ``--workers``
workers, then samples the summed PSS of its tree (``/proc/PID/smaps_rollup``, shared
pages split between the processes that map them); ``peak`` is the highest sample of
``pss_monitor.py`` (every 50 ms) from building the source to the last batch: it includes
the moment the source copies the array for the workers, while the original still exists. The table gives each figure less the
baseline in copies of the array. ``--tree NAME=PATH`` (repeat it) runs the cases against
other checkouts too (the code before a change), side by side in one run, as
``transport.py`` does (``PYTHONPATH=PATH``: the checkout's ``sources``, ``samplers`` and
``operations`` must import as ``dataloader.*`` from there, e.g. links
``dataloader/sources -> ../sources``).

    .venv/bin/python benchmarks/in_memory_pss.py                 # 400 MB, 2 workers, 150 batches
    .venv/bin/python benchmarks/in_memory_pss.py --mb 100 --batches 50
    .venv/bin/python benchmarks/in_memory_pss.py --tree before=/tmp/before --tree after=.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from bench_env import add_tree_option, trees_of

ROW = 4096  # float64 values per record: 32 KiB


def row_sum(row):
    return float(row.sum())


def _case(case: str, mb: int, workers: int, batches: int) -> dict[str, float]:
    import numpy as np
    import psutil
    from pss_monitor import tree_pss

    import dataloader as dl

    me = psutil.Process(os.getpid())
    rows = max(1, (1 if case == "baseline" else mb) * 2**20 // (ROW * 8))
    array = np.random.default_rng(0).random((rows, ROW))
    nbytes = array.nbytes
    monitor = subprocess.Popen([sys.executable, str(Path(__file__).with_name("pss_monitor.py")), str(os.getpid()), "0.05"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert monitor.stdout is not None and monitor.stdout.readline().strip() == "ready"
    source = dl.InMemoryDataSource(array)
    if case != "kept":
        del array
    batch = -(-rows // batches)
    loader = dl.DataLoader(source, dl.IndexSampler(rows, shuffle=True, seed=1, num_epochs=1),
                           [dl.MapTransform(row_sum), dl.Batch(batch)], worker_count=workers)
    with iter(loader) as it:
        read = sum(len(b) for b in it)
        steady = tree_pss(me, monitor.pid)
    peak = int(monitor.communicate("stop\n", timeout=60)[0].split()[-1])
    assert read == rows, (read, rows)
    return {"nbytes": nbytes, "steady": steady, "peak": peak}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=400)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batches", type=int, default=150)
    add_tree_option(parser)
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        print(json.dumps(_case(args.case, args.mb, args.workers, args.batches)))
        return
    trees = trees_of(args)
    here = str(Path(__file__).resolve().parent)
    print(f"InMemoryDataSource over {args.mb} MB, {args.workers} workers, {args.batches} batches "
          f"(tree PSS: trainer, fork server, workers)")
    print(f"{'tree':<8} {'case':<12} {'steady MB':>10} {'peak MB':>9} {'steady - baseline':>18} {'copies':>7}")
    for name, path in trees:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(path).resolve()), here]))
        results = {}
        for case in ("baseline", "handed over", "kept"):
            out = subprocess.run([sys.executable, __file__, "--case", case, "--mb", str(args.mb), "--workers",
                                  str(args.workers), "--batches", str(args.batches)],
                                 env=env, cwd=path, check=True, capture_output=True, text=True).stdout
            results[case] = json.loads(out.splitlines()[-1])
        base = results["baseline"]
        for case, r in results.items():
            extra = r["steady"] - base["steady"]
            copies = "" if case == "baseline" else f"{extra / r['nbytes']:.2f}"
            print(f"{name:<8} {case:<12} {r['steady'] / 1e6:>10.0f} {r['peak'] / 1e6:>9.0f} "
                  f"{extra / 1e6:>18.0f} {copies:>7}")


if __name__ == "__main__":
    main()
