"""Thread workers against worker processes and ``worker_count=0``, side by side in one run.

Five pipelines, each on data this script makes (in ``--data``, default a temporary
folder), each row in a fresh interpreter so no row inherits another's memory:

* ``png``: PNG decode with PIL (128x128 RGB) to a float32 array (PIL releases the GIL);
* ``zlib``: zlib-compressed float32 arrays, inflated and normalised with numpy;
* ``bpe``: Hugging Face ``tokenizers`` BPE (trained here on made-up text) over lines,
  with ``encode_batch`` (which releases the GIL; ``encode`` holds it throughout);
* ``parquet``: one Parquet row group per record, read with pyarrow
  (``use_threads=False``: decoded in the calling thread, GIL released) into numpy
  arrays column by column;
* ``python``: a pure-Python map (a loop over integers): holds the GIL, processes win.

granary's arms: ``0`` (in the training process), ``processes`` and ``threads``
(``--workers`` each, 2 by default) and ``auto`` (its choice printed). The peers', on the
same sources and operations: ``torch`` (torch's DataLoader, ``--workers`` processes),
``torch-0``, ``grain`` (Grain's DataLoader, ``--workers`` processes), ``grain-0`` and
``grain-threads`` (Grain's dataset API, the map on ``to_iter_dataset``'s ``--workers``
reading threads: Grain 0.2.18's thread-based path). The script re-runs itself in
``benchmarks/.venv`` (``setup_env.sh``), where the peers are installed. Per row: records per second after
the first batch, the training thread's CPU per batch (``time.thread_time`` of the
consumer: with threads the workers' CPU is elsewhere in the process, so the process CPU
per batch is shown too), the peak PSS of the process tree (``pss_monitor.py``, every
50 ms) and the time to the first batch. The machine's load average is printed before
and after: the development VM has 2 cores shared with others, compare rows of one run.

    .venv/bin/python benchmarks/threads.py                   # every pipeline and arm, ~8 minutes
    .venv/bin/python benchmarks/threads.py --pipelines png,python --arms processes,threads,torch
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
PIPELINES = ("png", "zlib", "bpe", "parquet", "python")
GRANARY = ("0", "processes", "threads", "auto")
PEERS = ("torch", "torch-0", "grain", "grain-0", "grain-threads")
ARMS = GRANARY + PEERS
BATCH = 16


class Records:
    """Records kept in a file of pickled bytes, loaded lazily in each process."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._records: list | None = None
        self._n = len(self._load())

    def _load(self) -> list:
        if self._records is None:
            import pickle

            with open(self.path, "rb") as f:
                self._records = pickle.load(f)
        return self._records

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int):
        return self._load()[i]

    def __getstate__(self):
        return {"path": self.path, "_n": self._n, "_records": None}


class RowGroups:
    """Record ``i``: row group ``i`` of a Parquet file (one reader per thread)."""

    def __init__(self, path: str, n: int) -> None:
        self.path, self.n = path, n
        self._local = threading.local()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        import pyarrow.parquet as pq

        reader = getattr(self._local, "reader", None)
        if reader is None:
            reader = self._local.reader = pq.ParquetFile(self.path)
        # use_threads=False: the row group is decoded in the calling thread, with the GIL
        # released (the loader's workers are the parallelism; Arrow's own pool would add
        # a hand-over per record, which took half the CPU of a 2048-row group here).
        table = reader.read_row_group(int(i), use_threads=False)
        return {name: table.column(name).to_numpy() for name in table.column_names}

    def __getstate__(self):
        return {"path": self.path, "n": self.n}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._local = threading.local()


def decode_png(record: bytes) -> np.ndarray:
    from PIL import Image

    with Image.open(io.BytesIO(record)) as image:
        return np.asarray(image, dtype=np.float32) / 255.0


def inflate(record: bytes) -> np.ndarray:
    x = np.frombuffer(zlib.decompress(record), dtype=np.float32)
    return (x - x.mean()) / (x.std() + 1e-6)


class Tokenize:
    def __init__(self, path: str) -> None:
        self.path = path
        self._tok = None

    def __call__(self, line: str) -> np.ndarray:
        if self._tok is None:
            from tokenizers import Tokenizer

            self._tok = Tokenizer.from_file(self.path)
        # encode_batch, not encode: tokenizers releases the GIL in encode_batch only (its
        # encode holds it for the whole line), so this is how a pipeline that tokenizes on
        # threads is written. TOKENIZERS_PARALLELISM=false (set by measure()): the loader's
        # workers are the parallelism, not tokenizers' own thread pool.
        ids = self._tok.encode_batch([line])[0].ids
        out = np.zeros(512, dtype=np.int32)
        out[: min(512, len(ids))] = ids[:512]
        return out

    def __getstate__(self):
        return {"path": self.path, "_tok": None}


def columns_to_array(row: dict) -> np.ndarray:
    return np.stack([row["a"], row["b"].astype(np.float64)], axis=1)[:256]


def python_loop(record: int) -> np.ndarray:
    total = 0
    for i in range(20000):
        total += (i * record) % 7
    return np.array([total], dtype=np.int64)


def make_data(folder: Path) -> dict[str, dict]:
    """Writes each pipeline's data once; returns how to build each."""
    import pickle

    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    made: dict[str, dict] = {}
    png = folder / "png.pkl"
    if not png.exists():
        from PIL import Image

        records = []
        base = np.linspace(0, 255, 128 * 128 * 3).reshape(128, 128, 3)
        for _ in range(256):
            pixels = (base + rng.integers(0, 40, base.shape)).clip(0, 255).astype(np.uint8)
            out = io.BytesIO()
            Image.fromarray(pixels).save(out, format="PNG")
            records.append(out.getvalue())
        png.write_bytes(pickle.dumps(records))
    made["png"] = {"path": str(png)}
    z = folder / "zlib.pkl"
    if not z.exists():
        records = [zlib.compress((rng.standard_normal(65536) * 3).round(2).astype(np.float32).tobytes(), 6)
                   for _ in range(256)]
        z.write_bytes(pickle.dumps(records))
    made["zlib"] = {"path": str(z)}
    text, tok = folder / "text.pkl", folder / "bpe.json"
    if not text.exists() or not tok.exists():
        words = ["".join(chr(97 + int(c)) for c in rng.integers(0, 26, rng.integers(2, 9))) for _ in range(3000)]
        lines = [" ".join(rng.choice(words, 400)) for _ in range(512)]
        from tokenizers import Tokenizer, models, pre_tokenizers, trainers

        tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
        tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
        tokenizer.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=4000, special_tokens=["[UNK]"]))
        tokenizer.save(str(tok))
        text.write_bytes(pickle.dumps(lines))
    made["bpe"] = {"path": str(text), "tokenizer": str(tok)}
    parquet = folder / "rows.parquet"
    if not parquet.exists():
        import pyarrow as pa
        import pyarrow.parquet as pq

        n = 256 * 2048
        table = pa.table({"a": rng.standard_normal(n), "b": rng.integers(0, 1000, n)})
        pq.write_table(table, parquet, row_group_size=2048)
    made["parquet"] = {"path": str(parquet), "groups": 256}
    made["python"] = {}
    return made


def pipeline(name: str, data: dict):
    """The pipeline ``name`` as (source, operation on one record): the same for every arm."""
    if name == "parquet":
        return RowGroups(data["path"], data["groups"]), columns_to_array
    if name == "python":
        return Range(256), python_loop
    op = {"png": decode_png, "zlib": inflate}.get(name) or Tokenize(data["tokenizer"])
    return Records(data["path"]), op


class Range:
    """Records ``0 .. n-1`` (the pure-Python pipeline's input), a source for every arm."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return int(i)


class Mapped:
    """torch's map-style dataset: the operation applied to the source's record."""

    def __init__(self, source, op) -> None:
        self.source, self.op = source, op

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i: int):
        return self.op(self.source[i])


def granary(source, op, arm: str, workers: int):
    import dataloader as dl

    sampler = dl.IndexSampler(len(source), shuffle=True, seed=0, num_epochs=None)
    kwargs = {} if arm == "0" else {"worker_count": workers, "worker_kind": arm}
    return iter(dl.DataLoader(source, sampler, [dl.MapTransform(op), dl.Batch(BATCH)], **kwargs))


def torch_peer(source, op, workers: int):
    """torch's DataLoader as its users write it: a map-style dataset, shuffled (epochs
    drawn one after another by the sampler, so one iterator runs the whole row), default
    collate, workers by torch's default start method (fork on Linux)."""
    import torch
    from torch.utils.data import DataLoader, RandomSampler

    dataset = Mapped(source, op)
    sampler = RandomSampler(dataset, num_samples=len(dataset) * 10_000, generator=torch.Generator().manual_seed(0))
    return iter(DataLoader(dataset, batch_size=BATCH, sampler=sampler, num_workers=workers))


def grain_peer(source, op, workers: int, threads: bool):
    """Grain 0.2.18: its DataLoader (``workers`` processes; its default ReadOptions), or
    with ``threads`` its dataset API where the map runs on ``to_iter_dataset``'s reading
    threads (``ReadOptions(num_threads=workers)``; the prefetch buffer cut from 500
    records to 4 batches so that its memory compares with the others')."""
    import grain
    import grain.python as gp
    from absl import flags

    if not flags.FLAGS.is_parsed():  # grain reads absl flags when it starts workers
        flags.FLAGS.mark_as_parsed()

    class Op(gp.MapTransform):
        def map(self, element):
            return op(element)

    if threads:
        dataset = grain.MapDataset.source(source).shuffle(seed=0).repeat().map(op)
        read = grain.ReadOptions(num_threads=workers, prefetch_buffer_size=4 * BATCH)
        return iter(dataset.to_iter_dataset(read).batch(BATCH))
    sampler = gp.IndexSampler(len(source), gp.NoSharding(), shuffle=True, num_epochs=None, seed=0)
    return iter(gp.DataLoader(data_source=source, sampler=sampler, operations=[Op(), gp.Batch(BATCH)],
                              worker_count=workers))


def build(name: str, data: dict, arm: str, workers: int):
    """An iterator of batches of ``name`` for ``arm`` (see :data:`ARMS`)."""
    source, op = pipeline(name, data)
    if arm in ("torch", "torch-0"):
        return torch_peer(source, op, workers if arm == "torch" else 0)
    if arm in ("grain", "grain-0", "grain-threads"):
        return grain_peer(source, op, 0 if arm == "grain-0" else workers, threads=arm == "grain-threads")
    return granary(source, op, arm, workers)


def measure(request: dict) -> dict:
    """One row, in this fresh interpreter."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # workers inherit it (see Tokenize)
    monitor = subprocess.Popen(
        [sys.executable, str(HERE / "pss_monitor.py"), str(os.getpid()), "0.05"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    assert monitor.stdout is not None and monitor.stdin is not None
    monitor.stdout.readline()  # ready
    began = time.perf_counter()
    it = build(request["pipeline"], request["data"], request["arm"], request["workers"])
    next(it)
    first = time.perf_counter() - began
    cpu, process_cpu, start, batches = time.thread_time(), time.process_time(), time.perf_counter(), 0
    while time.perf_counter() - start < request["seconds"]:
        next(it)
        batches += 1
    wall = time.perf_counter() - start
    cpu, process_cpu = time.thread_time() - cpu, time.process_time() - process_cpu
    chosen = it.stats()["pipeline"].get("workers", {}) if request["arm"] in GRANARY else {}
    close = getattr(it, "close", None) or getattr(it, "_shutdown_workers", None)  # granary, torch
    if close is not None:
        close()
    del it
    monitor.stdin.write("stop\n")
    monitor.stdin.flush()
    peak = int(monitor.stdout.readline())
    monitor.wait()
    return {
        "ok": True, "records_s": batches * BATCH / wall, "trainer_cpu_ms": 1e3 * cpu / max(batches, 1),
        "process_cpu_ms": 1e3 * process_cpu / max(batches, 1), "pss_mb": peak / 2**20,
        "first_s": first, "chosen": chosen.get("worker_kind", "in_process" if request["arm"] in GRANARY else ""),
        "gil": chosen.get("gil_share"),
    }


def median_row(replies: list[dict]) -> dict:
    """The reply with the median records/s (so that its columns belong together), with
    the spread of the runs' records/s."""
    ok = sorted((r for r in replies if r.get("ok")), key=lambda r: r["records_s"])
    if not ok:
        return replies[-1]
    row = dict(ok[(len(ok) - 1) // 2])
    row["spread"] = (ok[0]["records_s"], ok[-1]["records_s"]) if len(ok) > 1 else None
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pipelines", default=",".join(PIPELINES))
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs per row, going round the arms (a noisy machine's drift spreads evenly); "
                        "the median is shown")
    parser.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "granary-threads-bench"))
    parser.add_argument("--no-venv", action="store_true", help="run in this interpreter (peers absent: their rows fail)")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(json.loads(args.measure))), flush=True)
        return
    sys.path.insert(0, str(HERE))
    from bench_env import ensure_venv, run_row

    if not args.no_venv:
        ensure_venv(__file__, sys.argv[1:])  # the peers live in benchmarks/.venv

    made = make_data(Path(args.data))
    print(f"load average before: {os.getloadavg()}, cores: {os.cpu_count()}, workers: {args.workers}")
    header = f"{'pipeline':9} {'arm':13} {'rec/s':>8} {'x procs':>7} {'trainer ms/b':>12} {'process ms/b':>12} " \
             f"{'tree PSS MB':>11} {'first s':>7}  chosen"
    print(header)
    for name in args.pipelines.split(","):
        replies: dict[str, list[dict]] = {arm: [] for arm in args.arms.split(",")}
        for _ in range(args.repeat):
            for arm, got in replies.items():
                request = {"pipeline": name, "data": made[name], "arm": arm, "workers": args.workers,
                           "seconds": args.seconds}
                got.append(run_row(__file__, request, timeout=120 + 4 * args.seconds))
        rows = {arm: median_row(got) for arm, got in replies.items()}
        base = rows.get("processes", {}).get("records_s")
        for arm, r in rows.items():
            if not r.get("ok"):
                print(f"{name:9} {arm:13} failed: {r.get('reason')}")
                continue
            ratio = f"{r['records_s'] / base:.2f}" if base else "-"
            gil = f" (GIL share {r['gil']:.2f})" if r.get("gil") is not None else ""
            if r.get("spread"):
                gil += f"  [runs {r['spread'][0]:.0f}..{r['spread'][1]:.0f} rec/s]"
            print(f"{name:9} {arm:13} {r['records_s']:8.0f} {ratio:>7} {r['trainer_cpu_ms']:12.2f} "
                  f"{r['process_cpu_ms']:12.2f} {r['pss_mb']:11.0f} {r['first_s']:7.2f}  {r['chosen']}{gil}", flush=True)
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
