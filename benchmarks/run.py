"""Side-by-side loader benchmark: our DataLoader against its peers, same data.

For each data set (``raw`` 1 KB bytes, ``png`` ~1 KB images, ``jpeg`` ~150 KB
images) and each row (framework, workers) it starts a fresh Python process,
which reads the data set through that framework and reports one measurement
(see ``peers.py`` for what each column means). Then it prints one table per data
set, with throughput also as a ratio to the no-framework, one-process reader.

A row that cannot run (framework missing, API not there yet, crash, timeout)
prints ``not available: <reason>`` instead of numbers.

Usage::

    python benchmarks/run.py                  # everything, a few seconds per row
    python benchmarks/run.py --quick          # fewer records, shorter rows
    python benchmarks/run.py --only raw,grain --datasets png --workers 0,1

Run with any Python: unless ``--no-venv`` is given it first runs
``setup_env.sh`` and re-executes itself in ``benchmarks/.venv``, where the
peers are installed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import bench_env
from bench_env import ensure_venv

HERE = Path(__file__).resolve().parent

# Per data set: batch size, records per row (full, --quick).
# Record caps are high enough that on this 2-core machine the time cap
# (--max-seconds) usually ends a row first; "records" in the table says how many.
DATASET_RUNS = {
    "raw": {"batch_size": 128, "records": 200_000, "quick_records": 60_000},
    "png": {"batch_size": 128, "records": 50_000, "quick_records": 20_000},
    "jpeg": {"batch_size": 32, "records": 5_000, "quick_records": 1_200},
}
FRAMEWORKS = [
    "raw", "granary", "granary_spawn", "granary_auto", "grain", "grain_nothreads", "torch",
    "torch_spawn", "ceiling", "fork_pool",
]
DEFAULT_ROWS = [
    ("raw", 0),
    ("granary", 0),
    ("granary", 1),
    ("granary", 2),
    ("grain", 0),
    ("grain", 1),
    ("grain", 2),
    ("grain_nothreads", 0),
    ("grain_nothreads", 2),
    ("torch", 0),
    ("torch", 1),
    ("torch", 2),
    ("torch_spawn", 2),
]
ORDER_SEED = 0


# ---------------------------------------------------------------- child side


def measure_one(request: dict) -> dict:
    """Runs in the fresh child process: one row on one data set."""
    import data
    import numpy as np
    import peers

    spec = data.SPECS[request["dataset"]]
    paths = [str(p) for p in spec.files()]
    # The raw reader reads exactly the records our loader reads, in the same order.
    from dataloader.samplers import IndexSampler

    sampler = IndexSampler(spec.num_records, shuffle=True, seed=ORDER_SEED, num_epochs=1)
    order = sampler.record_keys(np.arange(min(request["records"], spec.num_records)))
    import ceiling

    loaders = {**peers.LOADERS, "ceiling": ceiling.ceiling_loader, "fork_pool": ceiling.fork_pool_loader}
    loader = loaders[request["framework"]]
    result = loader(
        paths,
        order,
        request.get("decoder") or spec.decoder,
        request["batch_size"],
        request["workers"],
        warmup_batches=request["warmup_batches"],
        max_seconds=request["max_seconds"],
    )
    return {"ok": True, **result.__dict__}


def child_main(payload: str) -> int:
    sys.path.insert(0, str(HERE))
    try:
        reply = measure_one(json.loads(payload))
    except BaseException as error:  # any failure becomes a table row
        reply = {"ok": False, "reason": f"{type(error).__name__}: {error}".splitlines()[0][:200]}
    # The last line of stdout is the answer; frameworks may print before it.
    sys.stdout.write("\n" + json.dumps(reply) + "\n")
    sys.stdout.flush()
    return 0


# --------------------------------------------------------------- parent side


def run_row(request: dict, timeout: float) -> dict:
    """Starts a fresh interpreter for one row and returns its reply."""
    return bench_env.run_row(__file__, request, timeout)


def median_reply(replies: list[dict]) -> dict:
    """The reply with the median throughput (so its columns belong together)."""
    ok = [r for r in replies if r.get("ok")]
    if not ok:
        return replies[-1]
    ok.sort(key=lambda r: r["records_per_s"])
    return ok[(len(ok) - 1) // 2]


def format_table(dataset: str, rows: list[tuple[str, int, dict]], meta: str) -> str:
    header = (
        f"{'framework':<16} {'workers':>7} {'records/s':>10} {'x raw':>6} {'1st batch s':>11} "
        f"{'peak PSS MB':>11} {'parent CPU ms/batch':>19} {'us/rec over raw':>15} {'records':>8}"
    )
    raw = next((r for name, w, r in rows if name == "raw" and r.get("ok")), None)
    lines = [f"== {dataset}: {meta}", header, "-" * len(header)]
    for name, workers, reply in rows:
        if not reply.get("ok"):
            lines.append(f"{name:<16} {workers:>7} not available: {reply['reason']}")
            continue
        ratio = f"{reply['records_per_s'] / raw['records_per_s']:.2f}" if raw else "-"
        # Framework cost per record above the raw reader (negative: faster than it).
        over = (
            f"{(1 / reply['records_per_s'] - 1 / raw['records_per_s']) * 1e6:.2f}" if raw else "-"
        )
        lines.append(
            f"{name:<16} {workers:>7} {reply['records_per_s']:>10,.0f} {ratio:>6} "
            f"{reply['first_batch_s']:>11.2f} {reply['peak_pss_mb']:>11.0f} "
            f"{reply['parent_cpu_ms_per_batch']:>19.2f} {over:>15} {reply['records']:>8}"
        )
    notes: dict[str, list[str]] = {}
    for name, workers, reply in rows:
        if reply.get("ok") and reply.get("notes"):
            notes.setdefault(reply["notes"], []).append(f"{name}/{workers}")
    lines += [f"  {', '.join(labels)}: {note}" for note, labels in notes.items()]
    return "\n".join(lines)


def format_scaling(dataset: str, rows: list[tuple[str, int, dict]], meta: str) -> str:
    """The scaling table: each row against the ceiling of as many processes."""
    header = (
        f"{'row':<14} {'N':>3} {'records/s':>10} {'% ceiling':>9} {'x fork pool':>11} "
        f"{'ramp rec/s (1st s)':>18} {'tree CPU us/rec':>15} {'x ceiling CPU':>13}"
    )
    by = {(name, w): r for name, w, r in rows if r.get("ok")}
    lines = [f"== scaling, {dataset}: {meta}", header, "-" * len(header)]
    for name, workers, reply in rows:
        if not reply.get("ok"):
            lines.append(f"{name:<14} {workers:>3} not available: {reply['reason']}")
            continue
        top, pool = by.get(("ceiling", workers)), by.get(("fork_pool", workers))
        pct = f"{100 * reply['records_per_s'] / top['records_per_s']:.0f}%" if top else "-"
        vs_pool = f"{reply['records_per_s'] / pool['records_per_s']:.2f}" if pool else "-"
        cpu = reply.get("tree_cpu_us_per_record", 0.0)
        vs_cpu = f"{cpu / top['tree_cpu_us_per_record']:.2f}" if top and top.get("tree_cpu_us_per_record") else "-"
        lines.append(
            f"{name:<14} {workers:>3} {reply['records_per_s']:>10,.0f} {pct:>9} {vs_pool:>11} "
            f"{reply.get('ramp_records_per_s', 0.0):>18,.0f} {cpu:>15.1f} {vs_cpu:>13}"
        )
    return "\n".join(lines)


def versions() -> str:
    import importlib.metadata
    import platform

    found = []
    for name in ("granary", "grain", "torch", "array_record", "numpy", "pillow"):
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{name} absent")
    return f"Python {platform.python_version()}; " + ", ".join(found)


def parse_list(text: str, allowed: list[str], what: str) -> list[str]:
    items = [t for t in text.split(",") if t]
    unknown = [t for t in items if t not in allowed]
    if unknown:
        raise SystemExit(f"unknown {what} {unknown}; choose from {allowed}")
    return items


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer records and shorter rows")
    parser.add_argument("--only", default="", help=f"comma-separated frameworks of {FRAMEWORKS}")
    parser.add_argument(
        "--datasets", default=",".join(DATASET_RUNS), help="comma-separated data sets"
    )
    parser.add_argument(
        "--workers", default="", help="comma-separated worker counts to keep, e.g. 0,2"
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs per row; the median is shown")
    parser.add_argument(
        "--max-seconds", type=float, default=None, help="cap on each row's timed part"
    )
    parser.add_argument("--warmup-batches", type=int, default=3)
    parser.add_argument(
        "--timeout", type=float, default=180, help="seconds before a row is abandoned"
    )
    parser.add_argument(
        "--json", type=Path, default=None, help="also write all replies to this file"
    )
    parser.add_argument("--no-venv", action="store_true", help="run in this interpreter as it is")
    parser.add_argument("--no-sampler", action="store_true", help="skip the sampler throughput")
    parser.add_argument(
        "--scaling", action="store_true",
        help="scaling mode: ceiling, fork pool and granary at each worker count (default "
        "1..cores-2, at least 2), timed from the first batch, with CPU per record of the tree",
    )
    parser.add_argument(
        "--decoder", default="", choices=["", "none", "png", "jpeg", "wait"],
        help="decode every data set with this decoder instead of its own; 'wait' sleeps "
        "100 us per record (latency-bound: many workers on few cores, see decoders.py)",
    )
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.measure is not None:
        return child_main(args.measure)
    if not args.no_venv:
        ensure_venv(__file__, argv)

    sys.path.insert(0, str(HERE))
    import data

    datasets = parse_list(args.datasets, list(DATASET_RUNS), "data sets")
    frameworks = parse_list(args.only, FRAMEWORKS, "frameworks") or FRAMEWORKS
    keep_workers = {int(w) for w in args.workers.split(",") if w}
    rows = [
        (name, w)
        for name, w in DEFAULT_ROWS
        if name in frameworks and (not keep_workers or w in keep_workers or name == "raw")
    ]
    max_seconds = args.max_seconds or (1.5 if args.quick else 4.0)
    if args.scaling:
        counts = sorted(keep_workers) or list(range(1, max(2, (os.cpu_count() or 2) - 2) + 1))
        default = ("ceiling", "fork_pool", "granary")
        names = [n for n in FRAMEWORKS if (n in frameworks if args.only else n in default)]
        rows = [(name, w) for w in counts for name in names]
        args.warmup_batches = 0
        max_seconds = max(max_seconds, 1.0)

    print(versions() + "\n", flush=True)
    if not args.no_sampler:
        import sampler

        print(sampler.format_result(sampler.sampler_throughput()) + "\n", flush=True)
    results: dict[str, list] = {}
    for dataset in datasets:
        data.ensure(dataset)
        run = DATASET_RUNS[dataset]
        records = run["quick_records"] if args.quick else run["records"]
        meta = (
            f"{data.SPECS[dataset].num_records} records of ~"
            f"{data.manifest(dataset)['stats']['mean_record_bytes'] / 1024:.1f} KiB, "
            f"batch {run['batch_size']}, up to {records} records or {max_seconds:g}s per row "
            f"after {args.warmup_batches} warm-up batches, median of {args.repeat}, {os.cpu_count()} CPUs"
            + (f", decoder {args.decoder}" if args.decoder else "")
        )
        replies: dict[tuple[str, int], list[dict]] = {row: [] for row in rows}
        # Repeats go round the rows, so slow drift of a noisy machine spreads evenly.
        for repeat in range(args.repeat):
            for name, workers in rows:
                earlier = replies[(name, workers)]
                if earlier and not earlier[0].get("ok"):
                    continue  # a row that cannot run will not run the next time either
                request = {
                    "dataset": dataset,
                    "framework": name,
                    "workers": workers,
                    "batch_size": run["batch_size"],
                    "records": records,
                    "warmup_batches": args.warmup_batches,
                    "max_seconds": max_seconds,
                    "decoder": args.decoder,
                }
                started = time.perf_counter()
                reply = run_row(request, args.timeout)
                replies[(name, workers)].append(reply)
                print(
                    f"  [{repeat + 1}/{args.repeat}] {dataset}/{name}/{workers}: "
                    + (
                        f"{reply['records_per_s']:,.0f} rec/s"
                        if reply.get("ok")
                        else reply["reason"]
                    )
                    + f" ({time.perf_counter() - started:.1f}s)",
                    file=sys.stderr,
                    flush=True,
                )
        table = [(name, workers, median_reply(replies[(name, workers)])) for name, workers in rows]
        results[dataset] = table
        formatter = format_scaling if args.scaling else format_table
        print(formatter(dataset, table, meta) + "\n", flush=True)

    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    d: [{"framework": n, "workers": w, **r} for n, w, r in t]
                    for d, t in results.items()
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
