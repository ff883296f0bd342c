"""Thread workers against worker processes and ``worker_count=0``, side by side in one run.

Five pipelines, each on data this script makes (in ``--data``, default a temporary
folder), each row in a fresh interpreter so no row inherits another's memory:

* ``png``: PNG decode with PIL (128x128 RGB) to a float32 array (PIL releases the GIL);
* ``zlib``: zlib-compressed float32 arrays, inflated and normalised with numpy;
* ``bpe``: Hugging Face ``tokenizers`` BPE (trained here on made-up text) over lines;
* ``parquet``: one Parquet row group per record, read with pyarrow into numpy arrays;
* ``python``: a pure-Python map (a loop over integers): holds the GIL, processes win.

Arms: ``0`` (in the training process), ``processes`` and ``threads`` (``--workers``
each, 2 by default) and ``auto`` (its choice printed). Per row: records per second after
the first batch, the training thread's CPU per batch (``time.thread_time`` of the
consumer: with threads the workers' CPU is elsewhere in the process, so the process CPU
per batch is shown too), the peak PSS of the process tree (``pss_monitor.py``, every
50 ms) and the time to the first batch. The machine's load average is printed before
and after: the development VM has 2 cores shared with others, compare rows of one run.

    .venv/bin/python benchmarks/threads.py                   # every pipeline, ~3 minutes
    .venv/bin/python benchmarks/threads.py --pipelines png,python --seconds 4
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
ARMS = ("0", "processes", "threads", "auto")
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
        table = reader.read_row_group(int(i))
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
        ids = self._tok.encode(line).ids
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


def build(name: str, data: dict, arm: str, workers: int):
    import dataloader as dl

    if name == "parquet":
        source = RowGroups(data["path"], data["groups"])
        op = columns_to_array
    elif name == "python":
        source, op = dl.RangeDataSource(256), python_loop
    else:
        source = Records(data["path"])
        op = {"png": decode_png, "zlib": inflate}.get(name) or Tokenize(data["tokenizer"])
    sampler = dl.IndexSampler(len(source), shuffle=True, seed=0, num_epochs=None)
    kwargs = {} if arm == "0" else {"worker_count": workers, "worker_kind": arm}
    return dl.DataLoader(source, sampler, [dl.MapTransform(op), dl.Batch(BATCH)], **kwargs)


def measure(request: dict) -> dict:
    """One row, in this fresh interpreter."""
    monitor = subprocess.Popen(
        [sys.executable, str(HERE / "pss_monitor.py"), str(os.getpid()), "0.05"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    assert monitor.stdout is not None and monitor.stdin is not None
    monitor.stdout.readline()  # ready
    loader = build(request["pipeline"], request["data"], request["arm"], request["workers"])
    began = time.perf_counter()
    it = iter(loader)
    next(it)
    first = time.perf_counter() - began
    cpu, process_cpu, start, batches = time.thread_time(), time.process_time(), time.perf_counter(), 0
    while time.perf_counter() - start < request["seconds"]:
        next(it)
        batches += 1
    wall = time.perf_counter() - start
    cpu, process_cpu = time.thread_time() - cpu, time.process_time() - process_cpu
    chosen = it.stats()["pipeline"].get("workers", {})
    it.close()
    monitor.stdin.write("stop\n")
    monitor.stdin.flush()
    peak = int(monitor.stdout.readline())
    monitor.wait()
    return {
        "ok": True, "records_s": batches * BATCH / wall, "trainer_cpu_ms": 1e3 * cpu / max(batches, 1),
        "process_cpu_ms": 1e3 * process_cpu / max(batches, 1), "pss_mb": peak / 2**20,
        "first_s": first, "chosen": chosen.get("worker_kind", "in_process"), "gil": chosen.get("gil_share"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pipelines", default=",".join(PIPELINES))
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "granary-threads-bench"))
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(json.loads(args.measure))), flush=True)
        return
    sys.path.insert(0, str(HERE))
    from bench_env import run_row

    made = make_data(Path(args.data))
    print(f"load average before: {os.getloadavg()}, cores: {os.cpu_count()}, workers: {args.workers}")
    header = f"{'pipeline':9} {'arm':10} {'rec/s':>8} {'x procs':>7} {'trainer ms/b':>12} {'process ms/b':>12} " \
             f"{'tree PSS MB':>11} {'first s':>7}  chosen"
    print(header)
    for name in args.pipelines.split(","):
        rows = {}
        for arm in args.arms.split(","):
            request = {"pipeline": name, "data": made[name], "arm": arm, "workers": args.workers, "seconds": args.seconds}
            rows[arm] = run_row(__file__, request, timeout=120 + 4 * args.seconds)
        base = rows.get("processes", {}).get("records_s")
        for arm, r in rows.items():
            if not r.get("ok"):
                print(f"{name:9} {arm:10} failed: {r.get('reason')}")
                continue
            ratio = f"{r['records_s'] / base:.2f}" if base else "-"
            gil = f" (GIL share {r['gil']:.2f})" if r.get("gil") is not None else ""
            print(f"{name:9} {arm:10} {r['records_s']:8.0f} {ratio:>7} {r['trainer_cpu_ms']:12.2f} "
                  f"{r['process_cpu_ms']:12.2f} {r['pss_mb']:11.0f} {r['first_s']:7.2f}  {r['chosen']}{gil}", flush=True)
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
