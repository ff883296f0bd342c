"""Streaming against random access, on the same Parquet files; TFRecord streaming.

A user measured granary's random access on Parquet at 17k rows/s against 737k reading in
order. This script puts the two side by side, with Grain's streaming datasets and the
libraries alone as peers, in one run on data it writes itself:

* ``--files`` Parquet files, ``--rows`` rows in all (``id`` int64, ``text`` ~100
  characters, ``label`` int64), row groups of ``--row-group`` rows; the same texts as
  TFRecord files (one record per row). Written once to ``benchmarks/data/streaming/``.
* Each row below reads from a fresh iterator until the data ends or ``--seconds`` pass,
  clock started after the first element (so worker start-up is not counted); the table
  shows the median rows/s of ``--repeat`` runs, the rows taking turns going first.

    python3 benchmarks/streaming.py            # in benchmarks/.venv (with Grain as a peer)
    python3 benchmarks/streaming.py --no-venv --rows 200000 --repeat 1

``--pipeline tokenize`` measures a text pipeline instead, the costly step of a language
model's input: ``--docs`` long documents (200 to 2,000 words) in 4 Parquet files ->
a Hugging Face ``tokenizers`` BPE model (trained here on the first files' texts) ->
first-fit packing into rows of ``--seq-len`` -> batches of 8; tokens/s (real tokens, not
padding) at 0, 1 and 2 workers (``mp_prefetch``), granary and Grain on the same files.
granary computes the reading and the tokenizer in the worker processes (unit by unit,
the same output for every count) and packs in the training process; Grain gives each
worker a slice of the stream.

    python3 benchmarks/streaming.py --pipeline tokenize --repeat 3

``--pipeline gzip`` measures element-wise work after a stage that can only be iterated:
the same documents as 4 gzip TFRecord files (no offsets to read from: a gzip file is
read from its start), interleaved -> parse + tokenize -> first-fit packing -> batches
of 8, tokens/s at 0, 1 and 2 workers. granary's parent reads the records in order and
ships them, 64 at a time, to the workers, which parse and tokenize (the same output for
every count); Grain (which reads no gzip TFRecord: a small reader of its own here) gives
each worker a slice of the files.

    python3 benchmarks/streaming.py --pipeline gzip --repeat 3

``--pipeline map`` is the pool's check for streams: the Parquet files above -> a
CPU-bound map (pure Python, ``--rounds`` passes of a hash over each row's text, about
150 us a row) -> ``mp_prefetch`` at 0, 1 and 2 workers, granary and Grain side by side.
Two forms of the stream: ``stream`` (``ParquetIterDataset(paths)``: each worker reads
its units' rows itself) and ``file list`` (MaxText's endless file list,
``MapDataset.source(paths).shuffle().repeat().map(ParquetIterDataset)`` interleaved:
the training process reads the stream in order and ships units of rows to the
workers). Besides rows/s and the ratio over 0 workers it prints the training process's
CPU per row (all its threads: what the stream costs the trainer) and that of the whole
process tree (trainer, fork server, workers): on a machine shared with other jobs these
two say more than the rates.

    python3 benchmarks/streaming.py --pipeline map --repeat 3
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from bench_env import ensure_venv

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "streaming"
WORDS = np.array(["data", "loader", "jax", "grain", "parquet", "stream", "shuffle", "window", "token", "model"])


def write_data(files: int, rows: int, row_group: int) -> tuple[list[str], list[str]]:
    """The Parquet and TFRecord files (written unless already there)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    import dataloader as dl

    folder = DATA / f"{files}x{rows // files}-rg{row_group}"
    folder.mkdir(parents=True, exist_ok=True)
    per_file = rows // files
    for f in range(files):
        parquet, tfrecord = folder / f"part-{f:03d}.parquet", folder / f"part-{f:03d}.tfrecord"
        if parquet.exists() and tfrecord.exists():
            continue
        rng = np.random.default_rng(f)
        ids = np.arange(f * per_file, (f + 1) * per_file)
        text = [" ".join(WORDS[rng.integers(0, len(WORDS), 16)]) for _ in range(per_file)]
        pq.write_table(pa.table({"id": ids, "text": text, "label": ids % 10}), parquet, row_group_size=row_group)
        dl.write_tfrecord(tfrecord, [t.encode() for t in text])
    return sorted(glob.glob(str(folder / "*.parquet"))), sorted(glob.glob(str(folder / "*.tfrecord")))


def measure(make: Callable[[], Iterator[Any]], seconds: float) -> tuple[float, int]:
    """(elements/s, elements timed) after the first element."""
    it = make()
    next(it)
    count, began = 0, time.perf_counter()
    for _ in it:
        count += 1
        if not count & 1023 and time.perf_counter() - began > seconds:
            break
    elapsed = time.perf_counter() - began
    if hasattr(it, "close"):
        it.close()
    return count / elapsed, count


def pyarrow_rows(paths: list[str]) -> Iterator[dict[str, Any]]:
    """No framework: pyarrow's batches, one dict per row (to_pylist), file after file."""
    import pyarrow.parquet as pq

    for path in paths:
        with pq.ParquetFile(path) as handle:
            for batch in handle.iter_batches():
                yield from batch.to_pylist()


def plain_tfrecords(paths: list[str]) -> Iterator[bytes]:
    """No framework, no checksum: the records' bytes, with struct and a buffered file."""
    import struct

    for path in paths:
        with open(path, "rb", buffering=1 << 20) as f:
            while header := f.read(12):
                (length,) = struct.unpack("<Q", header[:8])
                data = f.read(length)
                f.read(4)
                yield data


def rows_table(parquet: list[str], tfrecord: list[str], grain: Any) -> dict[str, Callable[[], Iterator[Any]]]:
    import dataloader as dl

    def granary_maxtext() -> Iterator[Any]:
        files = dl.MapDataset.source(parquet).shuffle(seed=0)
        ds = dl.experimental.InterleaveIterDataset(files.map(dl.experimental.ParquetIterDataset),
                                                   cycle_length=len(parquet))
        return iter(dl.experimental.WindowShuffleIterDataset(ds, window_size=100, seed=0))

    def granary_random(workers: int) -> Callable[[], Iterator[Any]]:
        source = dl.ParquetDataSource(parquet)
        ds = dl.MapDataset.source(source).seed(0).shuffle().to_iter_dataset()
        return lambda: iter(ds.mp_prefetch(dl.MultiprocessingOptions(num_workers=workers)))

    rows: dict[str, Callable[[], Iterator[Any]]] = {
        "granary ParquetIterDataset, 1 file": lambda: iter(dl.experimental.ParquetIterDataset(parquet[0])),
        "granary ParquetIterDataset, all files": lambda: iter(dl.experimental.ParquetIterDataset(parquet)),
        "granary MaxText path (file shuffle, interleave, window 100)": granary_maxtext,
        "granary ParquetDataSource random access, 0 workers": granary_random(0),
        "granary ParquetDataSource random access, 2 workers": granary_random(2),
        "pyarrow alone (iter_batches + to_pylist), all files": lambda: pyarrow_rows(parquet),
        "granary TFRecordIterDataset (CRCs checked), all files": lambda: iter(dl.experimental.TFRecordIterDataset(tfrecord)),
        "plain Python TFRecord reader (no CRC), all files": lambda: plain_tfrecords(tfrecord),
    }
    if grain is not None:
        ge = grain.experimental

        def grain_maxtext() -> Iterator[Any]:
            files = grain.MapDataset.source(parquet).shuffle(seed=0)
            ds = ge.InterleaveIterDataset(files.map(ge.ParquetIterDataset), cycle_length=len(parquet))
            return iter(ge.WindowShuffleIterDataset(ds, window_size=100, seed=0))

        def grain_tfrecords() -> Iterator[Any]:  # Grain's takes one path: interleave them
            return iter(ge.InterleaveIterDataset([ge.TFRecordIterDataset(p) for p in tfrecord], cycle_length=16))

        rows.update({
            "Grain ParquetIterDataset, 1 file": lambda: iter(ge.ParquetIterDataset(parquet[0])),
            "Grain ParquetIterDataset, all files": lambda: iter(ge.ParquetIterDataset(parquet)),
            "Grain MaxText path (file shuffle, interleave, window 100)": grain_maxtext,
            "Grain TFRecordIterDataset (no CRC check), all files": grain_tfrecords,
        })
    return rows


def write_documents(docs: int) -> tuple[list[str], str]:
    """Parquet files of long documents and a BPE tokenizer trained on some of them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = DATA / f"docs-{docs}"
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = folder / "bpe.json"
    rng = np.random.default_rng(0)
    syllables = np.array(["ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "ze", "po", "qu", "an", "el", "or", "is"])
    vocabulary = ["".join(rng.choice(syllables, size=rng.integers(1, 5))) for _ in range(5000)]
    paths = [str(folder / f"part-{f}.parquet") for f in range(4)]
    for path in paths:
        if not Path(path).exists():
            texts = [" ".join(rng.choice(vocabulary, size=rng.integers(200, 2000))) for _ in range(docs // 4)]
            pq.write_table(pa.table({"text": texts}), path, row_group_size=250)
    if not tokenizer.exists():
        from tokenizers import Tokenizer, models, pre_tokenizers, trainers

        bpe = Tokenizer(models.BPE(unk_token="[UNK]"))
        bpe.pre_tokenizer = pre_tokenizers.Whitespace()
        texts = pq.read_table(paths[0], columns=["text"]).column("text").to_pylist()[:500]
        bpe.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=8000, special_tokens=["[UNK]"]))
        bpe.save(str(tokenizer))
    return paths, str(tokenizer)


class Tokenize:
    """``{"text"}`` -> ``{"tokens"}`` with the BPE model, loaded once in each process."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._model: Any = None

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        if self._model is None:
            from tokenizers import Tokenizer

            self._model = Tokenizer.from_file(self.path)
        return {"tokens": np.asarray(self._model.encode(row["text"]).ids, np.int32)}

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "_model": None}


def tokenize_table(paths: list[str], tokenizer: str, seq_len: int, grain: Any) -> dict[str, Callable[[], Iterator[Any]]]:
    """The text pipeline at 0, 1 and 2 workers, granary's (when importable) and Grain's."""
    rows: dict[str, Callable[[], Iterator[Any]]] = {}
    length = {"tokens": seq_len}
    try:
        import dataloader as dl
    except ImportError:  # Grain's own interpreter
        dl = None
    for workers in (0, 1, 2):
        if dl is not None:
            def granary(workers: int = workers) -> Iterator[Any]:
                ds = dl.experimental.ParquetIterDataset(paths).map(Tokenize(tokenizer))
                ds = dl.experimental.FirstFitPackIterDataset(ds, length_struct=length, num_packing_bins=8)
                return iter(ds.batch(8).mp_prefetch(dl.MultiprocessingOptions(num_workers=workers)))

            rows[f"granary, {workers} workers"] = granary
        if grain is not None:
            from absl import flags

            if not flags.FLAGS.is_parsed():  # Grain's worker processes read its flags
                flags.FLAGS.mark_as_parsed()

            def grain_row(workers: int = workers) -> Iterator[Any]:
                ge = grain.experimental
                ds = ge.InterleaveIterDataset([ge.ParquetIterDataset(p) for p in paths], cycle_length=16)
                ds = ge.FirstFitPackIterDataset(ds.map(Tokenize(tokenizer)), length_struct=length, num_packing_bins=8)
                return iter(ds.batch(8).mp_prefetch(grain.MultiprocessingOptions(num_workers=workers)))

            rows[f"Grain, {workers} workers"] = grain_row
    return rows


def write_gzip_records(paths: list[str]) -> list[str]:
    """The documents of ``paths`` as gzip TFRecord files, one record a document."""
    import gzip

    import pyarrow.parquet as pq

    import dataloader as dl

    out = []
    for path in paths:
        target = Path(path).with_suffix(".tfrecord.gz")
        if not target.exists():
            plain = Path(path).with_suffix(".tfrecord")
            texts = pq.read_table(path, columns=["text"]).column("text").to_pylist()
            dl.write_tfrecord(plain, [t.encode() for t in texts])
            target.write_bytes(gzip.compress(plain.read_bytes(), compresslevel=6))
            plain.unlink()
        out.append(str(target))
    return out


class TokenizeRecord(Tokenize):
    """A TFRecord's bytes (a document's text) -> ``{"tokens"}``."""

    def __call__(self, record: Any) -> dict[str, Any]:  # type: ignore[override]
        return super().__call__({"text": bytes(record).decode()})


def grain_gzip_records(grain: Any) -> Any:
    """A Grain ``IterDataset`` of one gzip TFRecord file (Grain reads none): records in
    order, the state is how many were read (a restore reads up to there again)."""
    import gzip
    import struct

    class Records(grain.DatasetIterator):
        def __init__(self, path: str) -> None:
            super().__init__()
            self._path, self._file, self._count = path, gzip.open(path, "rb"), 0  # noqa: SIM115  (an iterator holds it open)

        def __next__(self) -> bytes:
            header = self._file.read(12)
            if len(header) < 12:
                raise StopIteration
            (length,) = struct.unpack("<Q", header[:8])
            data = self._file.read(length)
            self._file.read(4)
            self._count += 1
            return data

        def get_state(self) -> dict[str, int]:
            return {"count": self._count}

        def set_state(self, state: dict[str, int]) -> None:
            self._file, self._count = gzip.open(self._path, "rb"), 0  # noqa: SIM115
            for _ in range(state["count"]):
                next(self)

    class GzipRecords(grain.IterDataset):
        def __init__(self, path: str) -> None:
            super().__init__()
            self.path = path

        def __iter__(self) -> Records:
            return Records(self.path)

    return GzipRecords


def gzip_table(paths: list[str], tokenizer: str, seq_len: int, grain: Any) -> dict[str, Callable[[], Iterator[Any]]]:
    """gzip TFRecords -> parse + tokenize -> first-fit packing -> batch, at 0, 1, 2 workers."""
    import dataloader as dl

    rows: dict[str, Callable[[], Iterator[Any]]] = {}
    length = {"tokens": seq_len}
    for workers in (0, 1, 2):
        def granary(workers: int = workers) -> Iterator[Any]:
            files = dl.MapDataset.source(paths).map(dl.experimental.TFRecordIterDataset)
            ds = dl.experimental.InterleaveIterDataset(files, cycle_length=len(paths)).map(TokenizeRecord(tokenizer))
            ds = dl.experimental.FirstFitPackIterDataset(ds, length_struct=length, num_packing_bins=8)
            return iter(ds.batch(8).mp_prefetch(dl.MultiprocessingOptions(num_workers=workers)))

        rows[f"granary, {workers} workers"] = granary
        if grain is not None:
            def grain_row(workers: int = workers) -> Iterator[Any]:
                ge = grain.experimental
                files = grain.MapDataset.source(paths).map(grain_gzip_records(grain))
                ds = ge.InterleaveIterDataset(files, cycle_length=len(paths)).map(TokenizeRecord(tokenizer))
                ds = ge.FirstFitPackIterDataset(ds, length_struct=length, num_packing_bins=8)
                return iter(ds.batch(8).mp_prefetch(grain.MultiprocessingOptions(num_workers=workers)))

            rows[f"Grain, {workers} workers"] = grain_row
    return rows


def measure_tokens(make: Callable[[], Iterator[Any]], seconds: float) -> tuple[float, int]:
    """(tokens/s, tokens timed) after the first batch; a token is a non-padding position."""
    it = make()
    next(it)
    tokens, began = 0, time.perf_counter()
    for batch in it:
        tokens += int(np.count_nonzero(np.asarray(batch["tokens_segment_ids"])))
        if time.perf_counter() - began > seconds:
            break
    elapsed = time.perf_counter() - began
    if hasattr(it, "close"):
        it.close()
    return tokens / elapsed, tokens


def run_rows(
    rows: dict[str, Callable[[], Iterator[Any]]],
    measure_row: Callable[[Callable[[], Iterator[Any]], float], tuple[float, int]],
    args: argparse.Namespace,
) -> tuple[dict[str, float], dict[str, list[tuple[float, int]]]]:
    """The rows ``--only`` selects, each ``--repeat`` times, taking turns going first:
    (median rate per row, every run's (rate, count))."""
    if args.only:
        rows = {k: v for k, v in rows.items() if any(w in k for w in args.only.split(","))}
    results: dict[str, list[tuple[float, int]]] = {name: [] for name in rows}
    for r in range(args.repeat):
        for name in list(rows) if r % 2 == 0 else list(reversed(rows)):
            results[name].append(measure_row(rows[name], args.seconds))
    return {name: statistics.median(rate for rate, _ in runs) for name, runs in results.items()}, results


def main_tokenize(args: argparse.Namespace, grain: Any) -> int:
    paths, tokenizer = write_documents(args.docs)
    if args.pipeline == "gzip":
        paths = write_gzip_records(paths)
        rows = gzip_table(paths, tokenizer, args.seq_len, grain)
        if grain is not None:
            from absl import flags

            if not flags.FLAGS.is_parsed():  # Grain's worker processes read its flags
                flags.FLAGS.mark_as_parsed()
    else:
        rows = tokenize_table(paths, tokenizer, args.seq_len, grain)
    kind = "gzip TFRecord files (interleaved)" if args.pipeline == "gzip" else "Parquet files"
    print(f"{len(paths)} {kind} of {args.docs:,} documents -> BPE tokenizer -> first-fit packing "
          f"({args.seq_len} tokens) -> batches of 8; median of {args.repeat}, at most {args.seconds:g} s a run"
          + ("" if grain else "; Grain not installed") + "\n")
    medians, results = run_rows(rows, measure_tokens, args)
    header = f"{'pipeline':<22} {'tokens/s':>11} {'x 0 workers':>11} {'timed':>10}"
    print(header + "\n" + "-" * len(header))
    for name, rate in medians.items():
        base = medians.get(name.split(",")[0] + ", 0 workers")
        ratio = f"{rate / base:11.2f}" if base else f"{'':11}"
        print(f"{name:<22} {rate:>11,.0f} {ratio} {results[name][0][1]:>10,}")
    return 0


class HashText:
    """A CPU-bound map: ``rounds`` passes of a pure-Python hash over a row's text (no
    call that releases the GIL), ``{"id", "label", "hash"}`` out."""

    def __init__(self, rounds: int) -> None:
        self.rounds = rounds

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        text, h = row["text"], 0
        for _ in range(self.rounds):
            for c in text:
                h = (h * 31 + ord(c)) & 0xFFFFFFFF
        return {"id": row["id"], "label": row["label"], "hash": h}


def map_table(parquet: list[str], rounds: int, grain: Any) -> dict[str, Callable[[], Iterator[Any]]]:
    """Parquet stream -> CPU-bound map -> mp_prefetch at 0, 1, 2 workers, both forms of
    the stream (see the module), granary's and Grain's."""
    import dataloader as dl

    work = HashText(rounds)
    apis = [("granary", dl)] + ([("Grain", grain)] if grain is not None else [])
    rows: dict[str, Callable[[], Iterator[Any]]] = {}
    for name, api in apis:
        ge = api.experimental

        def stream(ge: Any = ge) -> Any:
            return ge.ParquetIterDataset(parquet)

        def file_list(api: Any = api, ge: Any = ge) -> Any:
            files = api.MapDataset.source(parquet).shuffle(seed=0).repeat()
            return ge.InterleaveIterDataset(files.map(ge.ParquetIterDataset), cycle_length=len(parquet))

        for form, make in (("stream", stream), ("file list", file_list)):
            for workers in (0, 1, 2):
                def row(api: Any = api, make: Any = make, workers: int = workers) -> Iterator[Any]:
                    options = api.MultiprocessingOptions(num_workers=workers)
                    return iter(make().map(work).mp_prefetch(options))

                rows[f"{name} {form}, {workers} workers"] = row
    return rows


def tree_cpu() -> dict[int, float]:
    """CPU seconds of this process and of each of its descendants (workers are the fork
    server's children), by pid."""
    import psutil

    me = psutil.Process()
    out = {me.pid: sum(me.cpu_times()[:2])}
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):  # ended meanwhile
            out[child.pid] = sum(child.cpu_times()[:2])
    return out


def measure_cpu(make: Callable[[], Iterator[Any]], seconds: float) -> tuple[float, int, float, float]:
    """(rows/s, rows timed, CPU seconds per row of this process, and of it and every
    process under it) after the first row."""
    it = make()
    next(it)
    count, began, cpu, tree = 0, time.perf_counter(), time.process_time(), tree_cpu()
    for _ in it:
        count += 1
        if not count & 255 and time.perf_counter() - began > seconds:
            break
    elapsed, cpu, after = time.perf_counter() - began, time.process_time() - cpu, tree_cpu()
    if hasattr(it, "close"):
        it.close()
    spent = sum(t - tree.get(pid, 0.0) for pid, t in after.items())
    return count / elapsed, count, cpu / max(count, 1), spent / max(count, 1)


def main_map(args: argparse.Namespace, grain: Any) -> int:
    import os

    parquet, _ = write_data(args.files, args.rows, args.row_group)
    rows = map_table(parquet, args.rounds, grain)
    if grain is not None:
        from absl import flags

        if not flags.FLAGS.is_parsed():  # Grain's worker processes read its flags
            flags.FLAGS.mark_as_parsed()
    print(f"{len(parquet)} Parquet files, {args.rows:,} rows -> HashText({args.rounds}) -> mp_prefetch; "
          f"median of {args.repeat}, at most {args.seconds:g} s a run; load {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs" + ("" if grain else "; Grain not installed") + "\n")
    cpu: dict[str, list[tuple[float, float]]] = {name: [] for name in rows}

    def timed(make: Callable[[], Iterator[Any]], seconds: float) -> tuple[float, int]:
        rate, count, per_row, tree = measure_cpu(make, seconds)
        cpu[next(n for n, m in rows.items() if m is make)].append((per_row, tree))
        return rate, count

    medians, results = run_rows(rows, timed, args)
    header = (f"{'pipeline':<34} {'rows/s':>9} {'x 0 workers':>11} {'trainer CPU us/row':>18} "
              f"{'all CPU us/row':>14} {'timed':>8}")
    print(header + "\n" + "-" * len(header))
    for name, rate in medians.items():
        base = medians.get(name.rsplit(",", 1)[0] + ", 0 workers")
        ratio = f"{rate / base:11.2f}" if base else f"{'':11}"
        trainer = statistics.median(c for c, _ in cpu[name]) * 1e6
        tree = statistics.median(t for _, t in cpu[name]) * 1e6
        print(f"{name:<34} {rate:>9,.0f} {ratio} {trainer:>18.1f} {tree:>14.1f} {results[name][0][1]:>8,}")
    print(f"load after: {os.getloadavg()[0]:.1f}")
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--rows", type=int, default=800_000)
    parser.add_argument("--row-group", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", default="", help="comma-separated words a row's name must contain one of")
    parser.add_argument("--no-venv", action="store_true", help="run here, without Grain unless it is installed")
    parser.add_argument("--pipeline", choices=("rows", "tokenize", "gzip", "map"), default="rows",
                        help="rows: readers side by side; tokenize: a text pipeline at 0, 1, 2 workers; "
                             "gzip: the same on gzip TFRecords (tokenizer after an iterated stage); "
                             "map: Parquet -> CPU-bound map at 0, 1, 2 workers, trainer CPU per row")
    parser.add_argument("--rounds", type=int, default=20, help="--pipeline map: hash passes over a row's text")
    parser.add_argument("--docs", type=int, default=8000, help="--pipeline tokenize: documents in all")
    parser.add_argument("--seq-len", type=int, default=2048, help="--pipeline tokenize: tokens per packed row")
    args = parser.parse_args(argv)
    if not args.no_venv:
        ensure_venv(__file__, argv)
    try:
        import grain  # imported before timing (it imports JAX)
    except ImportError:
        grain = None
    if args.pipeline in ("tokenize", "gzip"):
        return main_tokenize(args, grain)
    if args.pipeline == "map":
        return main_map(args, grain)

    parquet, tfrecord = write_data(args.files, args.rows, args.row_group)
    rows = rows_table(parquet, tfrecord, grain)
    print(f"{len(parquet)} Parquet files, {args.rows:,} rows, row groups of {args.row_group:,}; "
          f"{len(tfrecord)} TFRecord files; median of {args.repeat}, at most {args.seconds:g} s a run"
          + ("" if grain else "; Grain not installed") + "\n")
    medians, results = run_rows(rows, measure, args)
    reference = medians.get("granary ParquetDataSource random access, 0 workers")
    header = f"{'reader':<62} {'rows/s':>11} {'x random':>8} {'timed':>9}"
    print(header + "\n" + "-" * len(header))
    for name, rate in medians.items():
        ratio = f"{rate / reference:8.1f}" if reference and "TFRecord" not in name else f"{'':8}"
        print(f"{name:<62} {rate:>11,.0f} {ratio} {results[name][0][1]:>9,}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
