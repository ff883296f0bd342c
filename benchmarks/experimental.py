"""Grain's experimental stream datasets side by side with Grain: elements per second.

Each case runs the same in-memory stream through granary (``dl.experimental.*`` /
``dl.IterDataset.mix`` over ``MapDataset.source(...).to_iter_dataset()``) and through
Grain (``grain.experimental.*`` / ``grain.IterDataset.mix`` over
``grain.MapDataset.source(...).to_iter_dataset()``), alternating which goes first,
``--repeat`` times, in one process; the table shows the medians and checks that both
produced the same number of outputs.

* ``rebatch``: batches of 32 rows (a dict of a (32, 256) float32 and a (32,) int64) cut
  into batches of 48 (joins) and of 16 (cuts).
* ``cache``: the second and later passes of ``RepeatIterDataset(CacheIterDataset(ds), 4)``
  (the first pass reads the source).
* ``mix``: an iterator-level mixture of two streams, weights 1:3 (a dict for granary,
  which forces the iterator-level path).
* ``zip``, ``limit``: one element from each of two streams; the first n of one.
* ``source``: the bare stream of elements, the baseline the stages add to (Grain reads
  it without read threads, its fastest way for an in-memory list).

    python3 benchmarks/experimental.py              # in benchmarks/.venv (made by setup_env.sh)
    python3 benchmarks/experimental.py --elements 20000 --repeat 1
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from bench_env import ensure_venv

HERE = Path(__file__).resolve().parent


def batches(count: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [{"x": rng.random((32, 256), dtype=np.float32), "y": np.arange(32, dtype=np.int64) + 32 * i}
            for i in range(count)]


def elements(count: int) -> list[dict[str, np.ndarray]]:
    return [{"x": np.full(64, i, np.float32)} for i in range(count)]


def pipeline(lib: Any, case: str, data: list[Any], name: str) -> Any:
    """The case's dataset in ``lib`` (``dataloader`` or ``grain``)."""
    gx = lib.experimental
    source = lib.InMemoryDataSource(data) if name == "granary" else data

    def stream():
        if name == "granary":
            return lib.MapDataset.source(source).to_iter_dataset()
        # Grain's fastest read of an in-memory list: no read threads (its default of 16
        # threads reads ~25x slower here, which would hide the stages being compared).
        return lib.MapDataset.source(source).to_iter_dataset(
            read_options=lib.ReadOptions(num_threads=0, prefetch_buffer_size=0))

    if case == "source":
        return stream()
    if case.startswith("rebatch"):
        return gx.RebatchIterDataset(stream(), batch_size=int(case.split("_")[1]))
    if case == "cache":
        return gx.RepeatIterDataset(gx.CacheIterDataset(stream()), num_epochs=4)
    if case == "mix":
        if name == "granary":
            return lib.IterDataset.mix({"a": stream(), "b": stream()}, weights={"a": 1, "b": 3})
        return lib.IterDataset.mix([stream(), stream()], weights=[1, 3])
    if case == "zip":
        return gx.ZipIterDataset([stream(), stream()])
    assert case == "limit", case
    return gx.LimitIterDataset(stream(), len(data) // 2)


def measure(ds: Any, skip: int = 0) -> tuple[float, int]:
    """(seconds, outputs) over the stream, timing only after the first ``skip`` outputs."""
    it = iter(ds)
    for _ in range(skip):
        next(it)
    began, count = time.perf_counter(), 0
    for _ in it:
        count += 1
    return time.perf_counter() - began, count


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--elements", type=int, default=50_000)
    parser.add_argument("--batches", type=int, default=2_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-venv", action="store_true")
    args = parser.parse_args(argv)
    if not args.no_venv:
        ensure_venv(__file__, argv)
    import grain  # imported before timing: it imports JAX

    import dataloader as dl

    libs = {"granary": dl, "grain": grain}
    data = {"batches": batches(args.batches), "elements": elements(args.elements)}
    print(f"{args.batches:,} batches of 32 rows; {args.elements:,} elements; median of {args.repeat}\n")
    header = f"{'case':<12} {'granary /s':>12} {'Grain /s':>12} {'x Grain':>8} {'outputs g/G':>15}"
    print(header + "\n" + "-" * len(header))
    for case in ("source", "rebatch_48", "rebatch_16", "cache", "mix", "zip", "limit"):
        stream = data["batches"] if case.startswith("rebatch") else data["elements"]
        skip = len(stream) if case == "cache" else 0  # the first pass reads the source
        runs: dict[str, list[tuple[float, int]]] = {"granary": [], "grain": []}
        for r in range(args.repeat):
            for name in (["granary", "grain"] if r % 2 == 0 else ["grain", "granary"]):
                runs[name].append(measure(pipeline(libs[name], case, stream, name), skip))
        g = statistics.median(s for s, _ in runs["granary"])
        G = statistics.median(s for s, _ in runs["grain"])
        g_n, G_n = runs["granary"][0][1], runs["grain"][0][1]
        print(f"{case:<12} {g_n / g:>12,.0f} {G_n / G:>12,.0f} {G / g * g_n / G_n:>8.2f} {g_n:>7}/{G_n:<7}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
