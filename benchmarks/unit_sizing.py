"""What an unbatched stream's units cost: first-element latency, peak memory, throughput.

Units sized by cost (``dataloader.engine.sizing``) make an unbatched pipeline's first
element cost about one element; this measures it on the pipeline of issue 21, whose
``map`` makes an 8 MB array in about 4 ms, and shows that cheap small elements still
travel in big units. Each case runs in a fresh process (peak RSS is per process):

* ``first0``/``first2``: ``MapDataset.range(1000).repeat().map(f).to_iter_dataset()``,
  with 0 or 2 workers (``mp_prefetch``): the first ``next()`` in ms, the next 50, and
  the peak RSS of this process and of its children.
* ``prefetch``: the same behind ``ThreadPrefetchIterDataset(buffer 10)``: ``iter()`` and
  5 ``next()``, median of 10 (Grain's ``test_no_mem_leak`` loop).
* ``cheap0``/``cheap2``: ``MapDataset.range(10**6).map(x + 1)``: elements per second.

Usage::

    python benchmarks/unit_sizing.py                    # granary, every case
    python benchmarks/unit_sizing.py --impl grain       # the same on Grain, if installed
    python benchmarks/unit_sizing.py --cases first0,cheap0

Timings depend on the machine and its load: compare runs made side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import numpy as np

CASES = ("first0", "first2", "prefetch", "cheap0", "cheap2")


def costly(x):
    """An 8 MB array in about 4 ms (spinning the rest of the time)."""
    began = time.perf_counter()
    a = np.full((1000, 1000), x, dtype=np.int64)
    while time.perf_counter() - began < 0.004:
        pass
    return a


def add_one(x):
    return x + 1


def _api(impl: str):
    if impl == "grain":
        import grain
        from absl import flags

        flags.FLAGS.mark_as_parsed()
        return grain.MapDataset, grain.MultiprocessingOptions, grain.experimental.ThreadPrefetchIterDataset, grain.ReadOptions
    import dataloader as dl

    return dl.MapDataset, dl.MultiprocessingOptions, dl.experimental.ThreadPrefetchIterDataset, dl.ReadOptions


def _peak_mb(who: int = resource.RUSAGE_SELF) -> float:
    return resource.getrusage(who).ru_maxrss / 1024


def measure(case: str, impl: str) -> dict:
    map_dataset, mp_options, thread_prefetch, read_options = _api(impl)
    out: dict = {"case": case, "impl": impl}
    if case in ("first0", "first2"):
        ds = map_dataset.range(1000).repeat().map(costly).to_iter_dataset()
        if case == "first2":
            ds = ds.mp_prefetch(mp_options(num_workers=2))
        began = time.perf_counter()
        it = iter(ds)
        next(it)
        out["first_next_ms"] = (time.perf_counter() - began) * 1e3
        began = time.perf_counter()
        for _ in range(50):
            next(it)
        out["next_50_ms"] = (time.perf_counter() - began) * 1e3
        out["peak_rss_mb"] = _peak_mb()
        it.close()
        out["children_peak_rss_mb"] = _peak_mb(resource.RUSAGE_CHILDREN)
    elif case == "prefetch":
        ds = map_dataset.range(1000).repeat().map(costly).to_iter_dataset(read_options(prefetch_buffer_size=0))
        ds = thread_prefetch(ds, prefetch_buffer_size=10)
        times = []
        for _ in range(10):
            began = time.perf_counter()
            it = iter(ds)
            for _ in range(5):
                next(it)
            times.append((time.perf_counter() - began) * 1e3)
            it.close()
        out["iter_and_5_next_ms"] = float(np.median(times))
        out["peak_rss_mb"] = _peak_mb()
    else:
        ds = map_dataset.range(10**6).map(add_one).to_iter_dataset()
        if case == "cheap2":
            ds = ds.mp_prefetch(mp_options(num_workers=2))
        it = iter(ds)
        next(it)
        n = 300_000
        began = time.perf_counter()
        for _ in range(n):
            next(it)
        out["elements_per_s"] = n / (time.perf_counter() - began)
        it.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", choices=("granary", "grain"), default="granary")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child process's single case
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.impl)), flush=True)
        os._exit(0)  # Grain's worker threads may hold the exit otherwise
    for case in args.cases.split(","):
        if case not in CASES:
            parser.error(f"unknown case {case!r}; pick from {', '.join(CASES)}")
        done = subprocess.run(
            [sys.executable, __file__, "--impl", args.impl, "--one", case],
            capture_output=True, text=True, timeout=600,
        )
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        print(lines[-1] if lines else json.dumps({"case": case, "error": done.stderr.strip()[-300:]}))


if __name__ == "__main__":
    main()
