"""Packing side by side with Grain: fill ratio and tokens/s on the same stream.

The stream: ``--sequences`` token sequences with log-normal lengths (mean ~400 tokens,
as web text tokenises), cut to the row length (2048), held in memory so that packing is
what is measured. Each packer (first-fit and best-fit at several bin counts, and
concat-then-split) runs over the same stream in granary (``dl.experimental.*`` over
``MapDataset.source(...).to_iter_dataset()``) and in Grain (``grain.experimental.*``
over ``grain.MapDataset.source(...).to_iter_dataset()``), alternating which goes first,
``--repeat`` times; the table shows the median tokens/s and the fill ratio (real tokens
over all cells of the rows).

    python3 benchmarks/packing.py              # in benchmarks/.venv (made by setup_env.sh)
    python3 benchmarks/packing.py --sequences 5000 --repeat 1
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from bench_env import ensure_venv

HERE = Path(__file__).resolve().parent
ROW = 2048


def make_lengths(count: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    sigma = 1.0
    mu = np.log(400) - sigma**2 / 2  # mean of the log-normal: 400 tokens
    return np.clip(np.rint(rng.lognormal(mu, sigma, size=count)), 1, ROW).astype(np.int64)


def make_stream(lengths: np.ndarray) -> list[dict[str, np.ndarray]]:
    return [{"tokens": np.arange(n, dtype=np.int32) + 1} for n in lengths.tolist()]


def measure(rows_iter) -> tuple[float, float, int]:
    """(seconds, fill ratio, rows) over the whole stream."""
    began = time.perf_counter()
    real = cells = rows = 0
    for row in rows_iter:
        ids = row["tokens_segment_ids"]
        real += int(np.count_nonzero(ids))
        cells += ids.size
        rows += 1
    return time.perf_counter() - began, real / cells, rows


def granary_rows(stream, packer: str, bins: int):
    import dataloader as dl

    ds = dl.MapDataset.source(dl.InMemoryDataSource(stream)).to_iter_dataset()
    if packer == "concat_then_split":
        return dl.experimental.ConcatThenSplitIterDataset(ds, length_struct={"tokens": ROW})
    cls = dl.experimental.FirstFitPackIterDataset if packer == "first_fit" else dl.experimental.BestFitPackIterDataset
    return cls(ds, length_struct={"tokens": ROW}, num_packing_bins=bins, shuffle_bins=False)


def grain_rows(stream, packer: str, bins: int):
    import grain

    ds = grain.MapDataset.source(stream).to_iter_dataset()
    if packer == "concat_then_split":
        return grain.experimental.ConcatThenSplitIterDataset(ds, length_struct={"tokens": ROW})
    cls = grain.experimental.FirstFitPackIterDataset if packer == "first_fit" else grain.experimental.BestFitPackIterDataset
    return cls(ds, length_struct={"tokens": ROW}, num_packing_bins=bins, shuffle_bins=False)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sequences", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--bins", default="8,32")
    parser.add_argument("--no-venv", action="store_true")
    args = parser.parse_args(argv)
    if not args.no_venv:
        ensure_venv(__file__, argv)
    import grain  # noqa: F401  (imported before timing: it imports JAX)

    lengths = make_lengths(args.sequences)
    stream = make_stream(lengths)
    tokens = int(lengths.sum())
    print(f"{len(stream):,} sequences, {tokens:,} tokens (mean {lengths.mean():.0f}, "
          f"max {lengths.max()}), rows of {ROW}; median of {args.repeat}\n")
    cases = [(p, int(b)) for p in ("first_fit", "best_fit") for b in args.bins.split(",")]
    cases.append(("concat_then_split", 0))
    header = f"{'packer':<18} {'bins':>4} {'granary Mtok/s':>14} {'Grain Mtok/s':>12} {'x Grain':>7} {'granary fill':>12} {'Grain fill':>10} {'rows g/G':>13}"
    print(header + "\n" + "-" * len(header))
    for packer, bins in cases:
        runs: dict[str, list[tuple[float, float, int]]] = {"granary": [], "grain": []}
        for r in range(args.repeat):
            order = ["granary", "grain"] if r % 2 == 0 else ["grain", "granary"]
            for name in order:
                make = granary_rows if name == "granary" else grain_rows
                runs[name].append(measure(make(stream, packer, bins)))
        g_s = statistics.median(s for s, _, _ in runs["granary"])
        G_s = statistics.median(s for s, _, _ in runs["grain"])
        (_, g_fill, g_rows), (_, G_fill, G_rows) = runs["granary"][0], runs["grain"][0]
        print(f"{packer:<18} {bins or '-':>4} {tokens / g_s / 1e6:>14.2f} {tokens / G_s / 1e6:>12.2f} "
              f"{G_s / g_s:>7.2f} {g_fill:>12.4f} {G_fill:>10.4f} {g_rows:>6}/{G_rows:<6}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
