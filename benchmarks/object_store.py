"""ArrayRecord straight from an object store: granary's reader against per-record range
requests (what a FUSE mount does) and local disk; start-up for many small files.

Everything runs on this machine: moto's S3 server on 127.0.0.1 (a process of its own),
behind a proxy that adds
``--latency-ms`` (default 20 ms) to every request, as a store in another zone would. The
script writes its data itself (``--files`` files of ``--records`` records of ~1 KB
random bytes, ``group_size:1``, in a temporary folder) and uploads it.

Rows (records/s over the same ``--read`` records in one shuffled order, batches of
``--batch``, the median of ``--repeat`` runs):

* ``local disk``: ``ArrayRecordDataSource`` on the local files.
* ``per-record range requests``: the same source over ``s3://``, asked one record at a
  time: one ranged request per record, one after the other, as a FUSE mount serves
  array_record's reads.
* ``granary, per batch``: ``__getitems__(batch)``: the chunks of a batch fetched at once,
  coalesced and concurrent.
* ``granary, prefetching``: the same, and ``prefetch(next batch)`` before each batch (the
  sampler knows it), so fetching the next batch overlaps reading this one.
* ``granary, measured rule``: per batch, with the whole-file rule on (the default): a
  file no bigger than 8 round trips' worth of bytes is downloaded whole at first read.

Through a ``DataLoader`` (``--loader-batches`` batches of ``--batch``, after the first, so
worker start-up is left out; a map after the batch sleeps ``--compute-ms`` per batch, the
work a training step's input pipeline does): ``worker_count`` 0 and 2, with the loader's
hints (``RemoteOptions(fetch_ahead=True)``, the default: the chunks of the units queued
behind the one being computed are fetched meanwhile) and without.

Start-up (``--startup-files`` small files): building the source from a glob (one
listing, then every file's index in concurrent ranged requests); from the index cache
(no request); and the per-file open a FUSE-mounted reader does (a metadata request and
a footer read per file, one file after the other), timed on the first 100 files and
scaled to all.

    python benchmarks/object_store.py
    python benchmarks/object_store.py --latency-ms 50 --files 8 --records 20000
    python benchmarks/object_store.py --only loader --compute-ms 30
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import dataloader as dl
from dataloader.sources import ArrayRecordDataSource, RemoteOptions, write_array_record
from tests.sources._object_store import (
    BUCKET,
    FaultProxy,
    make_bucket,
    s3_server_process,
    storage_options,
)


def _write(folder: str, prefix: str, files: int, records: int, size: int) -> dict[str, str]:
    rng = np.random.default_rng(0)
    out = {}
    for f in range(files):
        path = os.path.join(folder, f"{prefix}-{f:05d}.array_record")
        write_array_record(path, (rng.bytes(int(rng.integers(size // 2, size * 3 // 2)))
                                  for _ in range(records)))
        out[f"{prefix}/{os.path.basename(path)}"] = path
    return out


def _rate(read, order: np.ndarray, batch: int) -> float:
    began = time.perf_counter()
    for start in range(0, len(order), batch):
        read(order[start : start + batch], order[start + batch : start + 2 * batch])
    return len(order) / (time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--records", type=int, default=5000)
    parser.add_argument("--record-bytes", type=int, default=1000)
    parser.add_argument("--read", type=int, default=2048, help="records read per run")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--startup-files", type=int, default=1000)
    parser.add_argument("--compute-ms", type=float, default=30.0, help="work per batch in the loader rows")
    parser.add_argument("--loader-batches", type=int, default=40)
    parser.add_argument("--only", choices=["reads", "loader", "startup"], default=None)
    args = parser.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)

    with tempfile.TemporaryDirectory() as folder, s3_server_process() as endpoint, FaultProxy(endpoint) as proxy:
        data = _write(folder, "train", args.files, args.records, args.record_bytes)
        make_bucket(endpoint, data)
        options = storage_options(proxy.url)
        proxy.latency_s = args.latency_ms / 1000
        local = ArrayRecordDataSource(sorted(data.values()))
        order = np.random.default_rng(1).permutation(len(local))[: args.read]
        expected = local.__getitems__(order[:64])

        def remote(whole_file_bytes: int | None = 0, fetch_ahead: bool = True) -> ArrayRecordDataSource:
            return ArrayRecordDataSource(
                f"s3://{BUCKET}/train/*.array_record", storage_options=options,
                remote=RemoteOptions(cache_dir=os.path.join(folder, "cache"),
                                     whole_file_bytes=whole_file_bytes, fetch_ahead=fetch_ahead),
            )

        if args.only in (None, "reads"):
            _reads(args, proxy, local, order, expected, remote)
        if args.only in (None, "loader"):
            _loader(args, proxy, len(local), remote)
        if args.only in (None, "startup"):
            _startup(args, folder, endpoint, proxy, options)


def _loader(args: argparse.Namespace, proxy: FaultProxy, n: int, remote) -> None:
    pause = args.compute_ms / 1000

    def work(batch: np.ndarray) -> np.ndarray:
        time.sleep(pause)  # the pipeline's own work on the batch (decode, augment, ...)
        return batch

    ops = [dl.MapTransform(len), dl.Batch(args.batch), dl.MapTransform(work)]
    sampler = dl.IndexSampler(n, shuffle=True, seed=1, num_epochs=1)
    names = [(w, ahead) for w in (0, 2) for ahead in (False, True)]
    rates: dict[tuple[int, bool], list[float]] = {k: [] for k in names}
    requests: dict[tuple[int, bool], int] = {}
    waits: dict[tuple[int, bool], list[float]] = {k: [] for k in names}
    outputs = {}
    for _ in range(args.repeat):
        for workers, ahead in names:
            source = remote(0, ahead)  # a cold cache each time; ranges only
            before = proxy.requests
            loader = iter(dl.DataLoader(source, sampler, ops, worker_count=workers))
            first = next(loader)
            began = time.perf_counter()
            got = [first, *itertools.islice(loader, args.loader_batches)]
            rates[workers, ahead].append(args.loader_batches * args.batch / (time.perf_counter() - began))
            requests[workers, ahead] = proxy.requests - before
            stats = loader.stats()  # a unit's read: the wait for its chunks, and decoding
            waits[workers, ahead].append(1000 * stats["stage_seconds"]["read"] / max(stats["units"], 1))
            outputs[workers, ahead] = [b.tolist() for b in got]
            del loader
            source.close()
    assert all(o == outputs[0, False] for o in outputs.values()), "hints changed what was read"
    print(f"\nDataLoader, {args.loader_batches} batches of {args.batch} after the first, "
          f"{args.compute_ms:g} ms of work per batch, {args.latency_ms:g} ms per request, "
          f"median of {args.repeat}; ideal (work only) {1000 * args.batch / args.compute_ms:.0f} records/s per worker")
    print(f"{'':30s} {'records/s':>10s} {'read ms/unit':>13s} {'requests':>9s}")
    for workers, ahead in names:
        name = f"worker_count={workers}, hints {'on' if ahead else 'off'}"
        print(f"{name:30s} {statistics.median(rates[workers, ahead]):10.0f} "
              f"{statistics.median(waits[workers, ahead]):13.1f} {requests[workers, ahead]:9d}")


def _reads(args: argparse.Namespace, proxy: FaultProxy, local, order, expected, remote) -> None:
    def per_record(source):
        return lambda batch, _: [source[int(i)] for i in batch]

    def per_batch(source):
        return lambda batch, _: source.__getitems__(batch)

    def prefetching(source):
        def read(batch, following):
            if len(following):
                source.prefetch(following)
            return source.__getitems__(batch)

        return read

    rows: dict[str, list[float]] = {
        "local disk": [], "per-record range requests": [], "granary, per batch": [],
        "granary, prefetching": [], "granary, measured rule": []}
    requests = {name: 0 for name in rows}
    for _ in range(args.repeat):
        rows["local disk"].append(_rate(lambda b, _: local.__getitems__(b), order, args.batch))
        for name, reader in [("per-record range requests", per_record),
                             ("granary, per batch", per_batch),
                             ("granary, prefetching", prefetching),
                             ("granary, measured rule", per_batch)]:
            whole = None if name.endswith("rule") else 0
            source = remote(whole)  # a cold cache each time
            assert source.__getitems__(order[:64]) == expected
            source.close()
            source = remote(whole)
            before = proxy.requests
            rows[name].append(_rate(reader(source), order, args.batch))
            requests[name] = proxy.requests - before
            source.close()
    print(f"shuffled ArrayRecord reads, {args.files} files x {args.records} records of "
          f"~{args.record_bytes} B, {len(order)} records in batches of {args.batch}, "
          f"{args.latency_ms:g} ms per request (S3 server on 127.0.0.1), median of {args.repeat}")
    print(f"{'':30s} {'records/s':>10s} {'requests':>9s}")
    for name, rates in rows.items():
        shown = str(requests[name]) if name != "local disk" else "-"
        print(f"{name:30s} {statistics.median(rates):10.0f} {shown:>9s}")



def _startup(args: argparse.Namespace, folder: str, endpoint: str, proxy: FaultProxy, options) -> None:
    small = _write(folder, "small", args.startup_files, 20, 200)
    proxy.latency_s = 0.0
    make_bucket(endpoint, small)
    proxy.latency_s = args.latency_ms / 1000
    index = os.path.join(folder, "index.json")
    glob = f"s3://{BUCKET}/small/*.array_record"
    timings = {}
    for name in ("glob, indices read concurrently", "index cache (written by the first)"):
        before, began = proxy.requests, time.perf_counter()
        source = ArrayRecordDataSource(glob, storage_options=options,
                                       remote=RemoteOptions(index_cache=index,
                                                            cache_dir=os.path.join(folder, "cache")))
        timings[name] = (time.perf_counter() - began, proxy.requests - before)
        assert len(source) == 20 * args.startup_files
    import s3fs

    fs = s3fs.S3FileSystem(**options)
    keys = sorted(small)[:100]
    before, began = proxy.requests, time.perf_counter()
    for key in keys:
        size = fs.info(f"{BUCKET}/{key}")["size"]
        fs.cat_file(f"{BUCKET}/{key}", start=max(0, size - (1 << 16)), end=size)
    elapsed = (time.perf_counter() - began) * args.startup_files / len(keys)
    timings["per-file open, one after another (scaled)"] = (
        elapsed, (proxy.requests - before) * args.startup_files // len(keys))
    print(f"\nstart-up, {args.startup_files} files, {args.latency_ms:g} ms per request")
    print(f"{'':42s} {'seconds':>8s} {'requests':>9s}")
    for name, (seconds, count) in timings.items():
        print(f"{name:42s} {seconds:8.2f} {count:9d}")


if __name__ == "__main__":
    main()
