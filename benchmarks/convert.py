"""Converting TFRecord to ArrayRecord: granary's Beam pipeline against its peers, one run.

The benchmark writes its own input (``--records`` records of ``--record-bytes`` random
bytes, in ``--files`` TFRecord files under ``benchmarks/data/convert/``), then converts
it once per row, each row in a fresh Python process, and prints records/s and MB/s
(input bytes per second of wall time, pipeline start-up included), and the CPU seconds
of the row's whole process tree (its worker processes included), which a busy machine
disturbs less than the wall time:

* ``single process``: ``dataloader.cli.convert.convert``, the loop ``convert`` runs
  without Beam, one shard per input file's worth of records (``num_shards=files``).
* ``single process, 2 halves at once``: two such processes side by side, each on half
  of the files: what two cores of this machine give to two independent processes,
  the ceiling for any 2-worker row.
* ``granary beam``: ``dataloader.beam.convert`` on the DirectRunner, ``num_shards=files``
  (count, plan, write) and ``--match_shards`` (one shard per file), at 1 worker
  (in process) and 2 (``--direct_running_mode=multi_processing``).
* ``array_record beam``: array_record's own pipelines (shipped by array-record itself),
  ``array_record.beam.pipelines.convert_tf_to_arrayrecord_disk`` (``num_shards=files``)
  and ``convert_tf_to_arrayrecord_disk_match_shards``, at 1 and 2 workers of the same
  runner. Its module imports
  TensorFlow for a demo generator only; a placeholder module stands in for it.

Every row's output is read back (by this process, after the row's) and its record count
checked (and, for granary's rows, the exact records in order). Usage::

    python3 benchmarks/convert.py                 # 200,000 x 1 KiB in 8 files
    python3 benchmarks/convert.py --quick         # 40,000 records
    python3 benchmarks/convert.py --repeat 3      # median of 3

Run with any Python: it first runs ``setup_env.sh`` and re-executes itself in
``benchmarks/.venv`` (which has the project's ``beam`` extra).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import bench_env
from bench_env import ensure_venv

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "convert"
HALVES = "single process, 2 halves at once"
ROWS = [
    ("single process", 1),
    (HALVES, 2),
    ("granary beam, num_shards", 1),
    ("granary beam, num_shards", 2),
    ("granary beam, match_shards", 1),
    ("granary beam, match_shards", 2),
    ("array_record beam, num_shards", 1),
    ("array_record beam, num_shards", 2),
    ("array_record beam, match_shards", 1),
    ("array_record beam, match_shards", 2),
]


def beam_args(workers: int) -> list[str]:
    if workers == 1:
        return ["--runner=DirectRunner", "--direct_num_workers=1"]
    return ["--runner=DirectRunner", f"--direct_num_workers={workers}", "--direct_running_mode=multi_processing"]


def make_input(records: int, record_bytes: int, files: int) -> list[str]:
    """TFRecord files of random records (incompressible), written once and reused."""
    folder = DATA / f"{records}x{record_bytes}x{files}"
    paths = [str(folder / f"part-{i:05d}-of-{files:05d}.tfrecord") for i in range(files)]
    if all(os.path.exists(p) for p in paths):
        return paths
    import numpy as np
    from apache_beam.io.tfrecordio import _TFRecordUtil

    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    bounds = np.linspace(0, records, files + 1).astype(int)
    for i, path in enumerate(paths):
        with open(path + ".tmp", "wb") as f:
            for _ in range(bounds[i], bounds[i + 1]):
                _TFRecordUtil.write_record(f, rng.bytes(record_bytes))
        os.replace(path + ".tmp", path)
    return paths


# ---------------------------------------------------------------- child side


def measure(request: dict) -> dict:
    """Runs in a fresh process: one conversion, timed, and its output checked."""
    name, workers, files = request["row"], request["workers"], request["files"]
    out = Path(request["out"])
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    prefix = str(out / "part")
    if name.startswith("array_record"):
        sys.argv = sys.argv[:1]  # array_record.beam parses sys.argv when imported
        # array_record.beam.pipelines imports its demo module, which imports TensorFlow
        # for generating sample tf.train.Examples; the conversion never touches it, so a
        # placeholder stands in rather than a 570 MB install.
        import types

        sys.modules.setdefault("tensorflow", types.ModuleType("tensorflow"))
        from apache_beam.options.pipeline_options import PipelineOptions
        from array_record.beam import pipelines

        pattern = os.path.join(os.path.dirname(files[0]), "*.tfrecord")
        options = PipelineOptions(beam_args(workers))
        began = time.perf_counter()
        if "match_shards" in name:
            pipeline = pipelines.convert_tf_to_arrayrecord_disk_match_shards(
                args={"input": pattern, "output": prefix}, pipeline_options=options)
        else:
            pipeline = pipelines.convert_tf_to_arrayrecord_disk(
                num_shards=len(files), args={"input": pattern, "output": prefix}, pipeline_options=options)
        pipeline.run().wait_until_finish()
    elif name.startswith("granary beam"):
        from dataloader.beam import convert

        began = time.perf_counter()
        match = "match_shards" in name
        convert(files, prefix, num_shards=None if match else len(files), match_shards=match,
                pipeline_args=beam_args(workers), progress=False)
    elif name == HALVES:  # the machine's own parallel ceiling: two plain processes
        code = ("import json, sys; from dataloader.cli.convert import convert; f = json.loads(sys.argv[1]); "
                "convert(f, sys.argv[2], num_shards=len(f), progress=False)")
        began = time.perf_counter()
        halves = [subprocess.Popen([sys.executable, "-c", code, json.dumps(files[k::2]), f"{prefix}-{k}"])
                  for k in range(2)]
        if any(p.wait() for p in halves):
            raise RuntimeError("a half failed")
    else:
        from dataloader.cli.convert import convert as convert_in_process

        began = time.perf_counter()
        convert_in_process(files, prefix, num_shards=len(files), progress=False)
    return {"ok": True, "seconds": time.perf_counter() - began}


def check(name: str, outputs: list[str], files: list[str]) -> dict:
    """Counts the output's records; for granary's rows, compares them all, in order."""
    from array_record.python.array_record_module import ArrayRecordReader

    from dataloader.beam.tfrecord import read

    shards = [p for p in outputs if not os.path.basename(p).startswith(".")]
    readers = [ArrayRecordReader(p) for p in shards]
    count = sum(r.num_records() for r in readers)
    exact = None
    if not name.startswith("array_record") and name != HALVES:
        expected = (record for path in files for record in read(path))
        exact = all(a == b for r in readers for a, b in zip(r.read_all(), expected, strict=False))
    for r in readers:
        r.close()
    return {"records_out": count, "shards": len(shards), "exact": exact}


# --------------------------------------------------------------- parent side


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_row(request: dict, timeout: float) -> dict:
    """One row in a fresh process; adds the CPU seconds of its whole process tree."""
    cpu_before = _children_cpu()
    return {**bench_env.run_row(__file__, request, timeout), "cpu": _children_cpu() - cpu_before}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--record-bytes", type=int, default=1024)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="40,000 records")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--no-venv", action="store_true")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(json.loads(args.measure))), flush=True)
        return 0
    if not args.no_venv:
        ensure_venv(__file__, argv)
    records = 40_000 if args.quick else args.records
    files = make_input(records, args.record_bytes, args.files)
    megabytes = sum(os.path.getsize(p) for p in files) / 1e6
    print(f"input: {records:,} records of {args.record_bytes} bytes in {args.files} TFRecord files "
          f"({megabytes:,.0f} MB); {os.cpu_count()} cores; median of {args.repeat}; wall time "
          "includes pipeline start-up\n")
    times: dict[tuple[str, int], list[float]] = {row: [] for row in ROWS}
    cpu: dict[tuple[str, int], list[float]] = {row: [] for row in ROWS}
    notes: dict[tuple[str, int], str] = {}
    for _ in range(args.repeat):  # repeats go round the rows, so drift hits every row alike
        for row in ROWS:
            out = DATA / "out" / f"{row[0]}-{row[1]}".replace(" ", "_").replace(",", "")
            reply = run_row({"row": row[0], "workers": row[1], "files": files, "out": str(out)}, args.timeout)
            if reply["ok"]:  # checked here, so the row's CPU seconds are the conversion's
                reply.update(check(row[0], sorted(str(p) for p in out.iterdir()), files))
            shutil.rmtree(out, ignore_errors=True)  # rows of 1 GB inputs would fill the disk
            if not reply["ok"]:
                notes[row] = f"not available: {reply['reason']}"
            elif reply["records_out"] != records or reply["exact"] is False:
                notes[row] = f"WRONG OUTPUT: {reply['records_out']:,} records, exact={reply['exact']}"
            else:
                times[row].append(reply["seconds"])
                cpu[row].append(reply["cpu"])
                notes.setdefault(row, f"{reply['shards']} shards" + (", exact" if reply["exact"] else ""))
    print(f"| {'converter':<34} | workers | {'records/s':>9} | {'MB/s':>6} | seconds | CPU s | output |")
    print(f"|{'-' * 36}|---------|-----------|--------|---------|-------|--------|")
    for row in ROWS:
        if not times[row]:
            print(f"| {row[0]:<34} | {row[1]:>7} | {notes[row]} |")
            continue
        seconds = statistics.median(times[row])
        print(f"| {row[0]:<34} | {row[1]:>7} | {records / seconds:>9,.0f} | {megabytes / seconds:>6.1f} | "
              f"{seconds:>7.2f} | {statistics.median(cpu[row]):>5.1f} | {notes[row]} |")
    shutil.rmtree(DATA / "out", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
