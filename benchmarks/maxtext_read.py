"""MaxText's Grain pipeline on granary (through the grain alias) and on Grain, side by side.

The pipeline is MaxText's pre-training input without packing, written here from its
calls (``_grain_data_processing.py``): ArrayRecord files of ``tf.train.Example`` records
with a ``text`` feature (20 to 1,500 words) -> ``MapDataset.source`` -> ``shuffle(seed)`` -> ``repeat()`` ->
host slice ``[0::1]`` -> ``to_iter_dataset(ReadOptions(num_threads=16,
prefetch_buffer_size=500))`` -> parse the Example -> tokenize (a SentencePiece model
trained here) and trim to the sequence length -> ``inputs``/``targets`` -> pad to the
length with segmentation and positions -> ``batch(8, batch_and_pad)`` -> shift the
inputs -> ``mp_prefetch(num_workers=0)``. The same code runs with ``import grain.python
as grain`` giving Grain 0.2.18 or, with ``install_grain_alias()``, granary.

Each row runs in a fresh interpreter and reports, from ``iter(ds)``:

* ``1st batch s``: building the iterator to the first batch;
* ``rows/s 1-50``: rows of batches 1 to 50, timed from ``iter(ds)`` (what a job sees
  first, read-ahead filling included);
* ``rows/s after``: rows per second after the first batch, ``--batches`` batches;
* ``CPU us/row``: this process's CPU (every thread) per row, after the first batch;
* ``RSS MB paused``: the process's resident memory after the consumer then pauses for
  ``--pause`` seconds (a training step that takes long): the read-ahead fills up, and
  beside the row with no read-ahead threads (``0x0``) this says what it holds.

Rows: each implementation at 128 and 2,048 tokens with MaxText's ``ReadOptions(16, 500)``,
with one thread, and with none (``ReadOptions(0, 0)``). ``--tree NAME=PATH`` adds granary
rows run from another installed copy of the package (``PYTHONPATH=PATH``; the code before
a change, installed with ``pip install --target PATH --no-deps <checkout>``), so a change
is measured beside what it replaced in one run.

    python3 benchmarks/maxtext_read.py                    # in benchmarks/.venv
    python3 benchmarks/maxtext_read.py --repeat 3 --tree before=/tmp/before_site
    python3 benchmarks/maxtext_read.py --lengths 2048 --only granary

Figures depend on the machine and its load: compare rows of one run.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from bench_env import ensure_venv, run_row

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "maxtext"
SEED = 7
BATCH = 8
WORDS = ("data", "loader", "jax", "grain", "token", "model", "batch", "shard", "host", "record", "stream",
         "shuffle", "window", "packing", "sequence", "length", "train", "step", "device", "memory")
# The read options of the rows: MaxText's (base.yml's grain_num_threads: 16 and
# grain_prefetch_buffer_size: 500), one thread, and none.
READS = {"16x500": (16, 500), "1x500": (1, 500), "0x0": (0, 0)}


def write_data(files: int, docs: int) -> tuple[list[str], str]:
    """ArrayRecord files of Example records (documents of 20 to 1,500 words) and a
    SentencePiece model trained on the first ones; written once."""
    import dataloader as dl
    from dataloader.maxtext.records import encode_example

    folder = DATA / f"{files}x{docs // files}"
    folder.mkdir(parents=True, exist_ok=True)
    paths = [str(folder / f"part-{f}.array_record") for f in range(files)]
    rng = np.random.default_rng(0)
    words = np.array(WORDS)
    corpus = []
    for path in paths:
        texts = [" ".join(words[rng.integers(0, len(words), rng.integers(20, 1500))]) for _ in range(docs // files)]
        corpus += texts[:50]
        if not Path(path).exists():
            dl.write_array_record(path, [encode_example({"text": t}) for t in texts])
    model = folder / "sp.model"
    if not model.exists():
        import sentencepiece as spm

        text = folder / "corpus.txt"
        text.write_text("\n".join(t[:2000] for t in corpus))
        spm.SentencePieceTrainer.train(
            input=str(text), model_prefix=str(folder / "sp"), vocab_size=200, model_type="bpe",
            unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2, num_threads=1)
    return paths, str(model)


# --- MaxText's steps, written for this benchmark (module level: picklable by reference) ---

_MODELS: dict[str, Any] = {}


def parse_text(record: bytes) -> dict[str, str]:
    """The Example's ``text`` feature as a string (MaxText's parse and normalize steps)."""
    from dataloader.maxtext.records import parse_example

    return {"text": parse_example(record)["text"][0].decode()}


def tokenize_and_trim(element: dict[str, Any], model: str, length: int) -> dict[str, np.ndarray]:
    """BOS, the ids, EOS, trimmed to ``length`` (MaxText's TokenizeAndTrim)."""
    processor = _MODELS.get(model)
    if processor is None:
        import sentencepiece

        processor = _MODELS[model] = sentencepiece.SentencePieceProcessor(model_file=model)
    ids = np.asarray([1, *processor.encode(element["text"]), 2][:length], np.int32)
    return {"inputs": ids, "targets": ids}


def pad_to_length(element: dict[str, np.ndarray], length: int) -> dict[str, np.ndarray]:
    """Each feature padded to ``length`` with its segmentation and positions."""
    out = {}
    for key, ids in element.items():
        out[key] = np.pad(ids, (0, length - len(ids)))
        out[f"{key}_segmentation"] = (np.arange(length) < len(ids)).astype(np.int32)
        out[f"{key}_position"] = np.arange(length, dtype=np.int32)
    return out


def shift_inputs(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Teacher forcing: the inputs shifted right by one (MaxText's ShiftData)."""
    out = dict(batch)
    for key in ("inputs", "inputs_segmentation"):
        shifted = np.zeros_like(batch[key])
        shifted[:, 1:] = batch[key][:, :-1]
        out[key] = shifted
    return out


def pipeline(grain: Any, paths: list[str], model: str, length: int, threads: int, prefetch: int) -> Any:
    ds = grain.MapDataset.source(grain.ArrayRecordDataSource(paths))
    ds = ds.shuffle(seed=SEED).repeat(None)[0::1]
    ds = ds.to_iter_dataset(read_options=grain.ReadOptions(num_threads=threads, prefetch_buffer_size=prefetch))
    ds = ds.map(parse_text).map(functools.partial(tokenize_and_trim, model=model, length=length))
    ds = ds.map(functools.partial(pad_to_length, length=length))
    batch_fn = functools.partial(grain.experimental.batch_and_pad, batch_size=BATCH, pad_value=0)
    ds = ds.batch(BATCH, batch_fn=batch_fn).map(shift_inputs)
    return ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=0, per_worker_buffer_size=1))


def measure(request: dict[str, Any]) -> dict[str, Any]:
    """One row, in this (fresh) interpreter."""
    if request["impl"] == "granary":
        from dataloader.compat import install_grain_alias

        install_grain_alias(force=True)
    else:
        from absl import flags

        flags.FLAGS.mark_as_parsed()
    import grain.python as grain

    threads, prefetch = READS[request["read"]]
    ds = pipeline(grain, request["paths"], request["model"], request["length"], threads, prefetch)
    began = time.perf_counter()
    it = iter(ds)
    next(it)
    first_s = time.perf_counter() - began
    for _ in range(49):
        next(it)
    first50 = 50 * BATCH / (time.perf_counter() - began)
    cpu, began = time.process_time(), time.perf_counter()
    for _ in range(request["batches"]):
        next(it)
    elapsed, cpu = time.perf_counter() - began, time.process_time() - cpu
    time.sleep(request["pause"])  # a long step: the read-ahead fills
    rss = _rss_mb()
    if hasattr(it, "close"):
        it.close()
    return {"ok": True, "first_s": first_s, "first50": first50,
            "after": request["batches"] * BATCH / elapsed,
            "cpu_us": cpu / (request["batches"] * BATCH) * 1e6, "rss_mb": rss}


def _rss_mb() -> float:
    """This process's resident memory now, in MB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--docs", type=int, default=4000)
    parser.add_argument("--lengths", default="128,2048")
    parser.add_argument("--reads", default=",".join(READS), help=f"read options of the rows, of {list(READS)}")
    parser.add_argument("--batches", type=int, default=150, help="batches timed after the first 50")
    parser.add_argument("--pause", type=float, default=10.0, help="seconds the consumer pauses before RSS is read")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--only", default="", help="comma-separated words a row's name must contain one of")
    parser.add_argument("--tree", action="append", default=[], help="NAME=PATH: granary rows from PATH too")
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(json.loads(args.measure))))
        return 0
    ensure_venv(__file__, argv)
    paths, model = write_data(args.files, args.docs)
    trees = [("granary", None)] + [(f"granary[{n}]", p) for n, p in (t.split("=", 1) for t in args.tree)]
    impls = [*trees, ("Grain", None)]
    rows = [(name, path, int(length), read) for name, path in impls for length in args.lengths.split(",")
            for read in args.reads.split(",")]
    if args.only:
        rows = [r for r in rows if any(w in f"{r[0]} {r[2]} {r[3]}" for w in args.only.split(","))]
    print(f"MaxText's pipeline (ArrayRecord Examples -> parse -> SentencePiece -> trim/pad -> batch of {BATCH} "
          f"-> shift, 0 workers), {args.docs:,} documents; load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs\n")
    results: dict[tuple[str, int, str], list[dict[str, Any]]] = {(r[0], r[2], r[3]): [] for r in rows}
    for r in range(args.repeat):
        for name, path, length, read in rows if r % 2 == 0 else list(reversed(rows)):
            request = {"impl": "grain" if name == "Grain" else "granary", "paths": paths, "model": model,
                       "length": length, "read": read, "batches": args.batches, "pause": args.pause}
            env = None if path is None else dict(os.environ, PYTHONPATH=path)
            results[(name, length, read)].append(run_row(__file__, request, timeout=900, env=env))
    header = (f"{'implementation':<18} {'tokens':>6} {'read':>7} {'1st batch s':>11} {'rows/s 1-50':>11} "
              f"{'rows/s after':>12} {'CPU us/row':>10} {'RSS MB paused':>13}")
    print(header + "\n" + "-" * len(header))
    for (name, length, read), runs in results.items():
        good = [x for x in runs if x.get("ok")]
        if not good:
            print(f"{name:<18} {length:>6} {read:>7}  not available: {runs[0].get('reason')}")
            continue

        def med(key: str, runs: list[dict[str, Any]] = good) -> float:
            return statistics.median(x[key] for x in runs)

        print(f"{name:<18} {length:>6} {read:>7} {med('first_s'):>11.2f} {med('first50'):>11,.0f} "
              f"{med('after'):>12,.0f} {med('cpu_us'):>10,.0f} {med('rss_mb'):>13,.0f}")
    print(f"\nload after: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
