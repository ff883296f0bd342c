"""Start-up at scale, simulated: H processes stand for H hosts, each building the same
F-file ArrayRecord data set in an object store and reading its first batch.

The store is moto's S3 server on 127.0.0.1 (a process of its own) behind a proxy that
adds ``--latency-ms`` to every request and logs it. The script writes ``--files`` files
of ``--records`` records of ``--record-bytes`` random bytes and uploads them. Each host
is a process started once (imports paid before any clock runs); per run, all hosts are
released at once and each does a host's start-up: build
``ArrayRecordDataSource("s3://data/set/*.array_record")`` (its own cache folder: hosts
share no disk), ``MapDataset.source(...).seed(0).shuffle()``, take its shard, ``batch``,
and read the first batch in this process. Three ways:

* ``no index``: every host lists the files and reads every file's index (one ranged
  request a file, all at once): files x hosts metadata requests.
* ``index``: the metadata index was built ahead (``python -m dataloader index``, its
  requests counted as the job's); every host lists the files (to check them against it:
  one request per 1,000 files) and reads the index (one request).
* ``key-value store``: ``shared_array_record_source``: host 0 lists the files and reads
  every file's index, then posts the metadata in the key-value store of the job's runtime
  (JAX's; here files in a shared folder stand for it); the other hosts build from it
  without a request.
* ``index + key-value store``: the same, host 0 reading the index built ahead.

Metadata requests are counted at the proxy: listings, HEADs, index reads and writes, and
ranged reads of a file's head or tail (where its index lies); the rest (chunks of
records) are data. The first batch's time is given for one host alone and for the
slowest of H, raw, and with each host's time spent waiting for a CPU taken out (its
main and I/O threads' run-queue wait, from ``/proc/<pid>/task/*/schedstat``): on a 2-core
machine, H processes wait for each other's CPU, which H hosts with their own do not.

    python benchmarks/startup_scale.py
    python benchmarks/startup_scale.py --hosts 16 --files 256 --latency-ms 20
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import multiprocessing
import os
import sys
import tempfile
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tests.sources._object_store import (
    BUCKET,
    FaultProxy,
    classify_requests,
    make_bucket,
    s3_server_process,
    storage_options,
)

MODES = ("no index", "index", "key-value store", "index + key-value store")
PREFIX = "set"


class FolderKeyValue:
    """The key-value store of a job's runtime (JAX's ``key_value_set`` and
    ``blocking_key_value_get``) as files in a folder all processes see."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def key_value_set(self, key: str, value: str) -> None:
        path = os.path.join(self.folder, key.replace("/", "_"))
        with open(f"{path}.{os.getpid()}.tmp", "w") as out:
            out.write(value)
        os.replace(f"{path}.{os.getpid()}.tmp", path)

    def blocking_key_value_get(self, key: str, timeout_in_ms: int) -> str:
        path = os.path.join(self.folder, key.replace("/", "_"))
        deadline = time.monotonic() + timeout_in_ms / 1000
        while not os.path.exists(path):
            if time.monotonic() > deadline:
                raise RuntimeError(f"DEADLINE_EXCEEDED waiting for {key}")
            time.sleep(0.002)
        with open(path) as f:
            return f.read()


def _cpu_wait_s() -> float:
    """Seconds the threads on a start-up's critical path have waited on a run queue so
    far: the main thread, and fsspec's I/O thread (the main thread sleeps while it runs
    the requests). Other threads (array_record's idle pool) are not waited for."""
    total = 0
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            if int(tid) == os.getpid() or name.startswith("fsspecIO"):
                with open(f"/proc/self/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[1])
    return total / 1e9


def _host(rank: int, conn: Any, options: dict[str, Any], batch: int) -> None:
    """One host: imports, then for each run, its start-up and first batch, timed."""
    logging.getLogger("botocore").setLevel(logging.ERROR)
    import dataloader as dl
    from dataloader.device.remote_index import shared_array_record_source

    conn.send("ready")
    while (job := conn.recv()) is not None:
        mode, hosts, run, folder = job
        glob = f"s3://{BUCKET}/{PREFIX}/*.array_record"
        index = f"s3://{BUCKET}/{PREFIX}/_granary_index.json"
        remote = dl.RemoteOptions(cache_dir=os.path.join(folder, f"cache-{run}-{rank}"), whole_file_bytes=0,
                                  storage_options=options)
        conn.recv()  # the start signal: every host goes at once
        began, waited = time.perf_counter(), _cpu_wait_s()
        if mode == "no index":
            source = dl.ArrayRecordDataSource(glob, remote=remote, index=False)
        elif mode == "index":
            source = dl.ArrayRecordDataSource(glob, remote=remote)
        else:  # with the index beside the data when it was built ahead, else without one
            shared = dataclasses.replace(remote, index_cache=index if mode.startswith("index") else None)
            source = shared_array_record_source(
                glob, remote=shared, client=FolderKeyValue(folder), process_index=rank,
                process_count=hosts, name=f"run-{run}")
        ready = time.perf_counter() - began
        ds = dl.MapDataset.source(source).seed(0).shuffle()[rank::hosts].batch(batch)
        first = next(iter(ds.to_iter_dataset()))
        seconds, waited = time.perf_counter() - began, _cpu_wait_s() - waited
        source.close()
        conn.send({"ready": ready, "seconds": seconds, "cpu_wait": min(waited, seconds), "records": len(first)})


def _classify(log: list[tuple[str, str, int | None, int | None]], sizes: dict[str, int]) -> dict[str, int]:
    from dataloader.sources.files.metadata_index import INDEX_NAME

    return classify_requests(log, sizes, INDEX_NAME)


def _run(conns: list[Any], mode: str, hosts: int, run: int, folder: str) -> list[dict[str, Any]]:
    os.makedirs(folder, exist_ok=True)
    for conn in conns[:hosts]:
        conn.send((mode, hosts, run, folder))
    for conn in conns[:hosts]:
        conn.send("go")
    return [conn.recv() for conn in conns[:hosts]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=64)
    parser.add_argument("--files", type=int, default=1024)
    parser.add_argument("--records", type=int, default=20)
    parser.add_argument("--record-bytes", type=int, default=100)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--modes", default=",".join(MODES))
    args = parser.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    modes = args.modes.split(",")
    import dataloader as dl
    from dataloader.cli.index import build_index

    with tempfile.TemporaryDirectory() as folder, s3_server_process() as endpoint, FaultProxy(endpoint) as proxy:
        rng = np.random.default_rng(0)
        files, sizes = {}, {}
        for f in range(args.files):
            path = os.path.join(folder, f"part-{f:05d}.array_record")
            dl.write_array_record(path, [rng.bytes(args.record_bytes) for _ in range(args.records)])
            files[f"{PREFIX}/{os.path.basename(path)}"] = path
            sizes[f"/{BUCKET}/{PREFIX}/{os.path.basename(path)}"] = os.path.getsize(path)
        make_bucket(endpoint, files)
        # A new file system (and listing cache) per source; timeouts long enough that a
        # busy server is waited for, not asked again (retries would add requests).
        options = storage_options(proxy.url, config_kwargs={
            "retries": {"max_attempts": 1}, "connect_timeout": 60, "read_timeout": 300})
        context = multiprocessing.get_context("spawn")
        pipes = [context.Pipe() for _ in range(args.hosts)]
        hosts = [context.Process(target=_host, args=(rank, child, options, args.batch), daemon=True)
                 for rank, (_, child) in enumerate(pipes)]
        for host in hosts:
            host.start()
        conns = [parent for parent, _ in pipes]
        for conn in conns:
            assert conn.recv() == "ready"
        proxy.latency_s = args.latency_ms / 1000
        print(f"{args.hosts} hosts, {args.files} files of {args.records} records, {args.latency_ms:g} ms "
              f"a request; first batch of {args.batch} records per host\n")
        built: dict[str, int] | None = None
        rows = []
        run = 0
        for mode in modes:
            if mode.startswith("index") and built is None:
                proxy.log.clear()
                print(build_index([f"s3://{BUCKET}/{PREFIX}/*.array_record"], storage_options=options))
                built = _classify(list(proxy.log), sizes)
            timings = {}
            for count in (1, args.hosts):
                run += 1
                proxy.log.clear()
                results = _run(conns, mode, count, run, os.path.join(folder, f"run-{run}"))
                requests = _classify(list(proxy.log), sizes)
                assert all(r["records"] == args.batch for r in results), results
                timings[count] = {
                    "ready": max(r["ready"] for r in results),
                    "first": max(r["seconds"] for r in results),
                    "own": max(r["seconds"] - r["cpu_wait"] for r in results),
                    "requests": requests,
                }
            metadata = sum(v for k, v in timings[args.hosts]["requests"].items() if k != "data")
            ahead = sum(v for k, v in built.items() if k != "data") if mode.startswith("index") and built else 0
            rows.append((mode, timings, metadata, ahead))
        for conn in conns:
            conn.send(None)
        for host in hosts:
            host.join(timeout=30)

    print(f"\nmetadata requests of the job (built ahead + made by the {args.hosts} hosts; bound: files + hosts)")
    print(f"{'':26s} {'job':>6s} {'ahead':>6s} {'hosts':>6s} {'bound':>6s}")
    for mode, _, metadata, ahead in rows:
        print(f"{mode:26s} {metadata + ahead:6d} {ahead:6d} {metadata:6d} {args.files + args.hosts:6d}")
    print("\nseconds, the slowest host: source built, first batch, first batch without waiting for a CPU")
    print(f"{'':26s} {'built: 1 host':>13s} {args.hosts:>3d} hosts {'ratio':>6s}   {'batch: 1 host':>13s} "
          f"{args.hosts:>3d} hosts {'ratio':>6s}   {'own CPU: ratio':>14s}")
    for mode, timings, _, _ in rows:
        one, many = timings[1], timings[args.hosts]
        print(f"{mode:26s} {one['ready']:13.2f} {many['ready']:9.2f} {many['ready'] / one['ready']:6.2f}   "
              f"{one['first']:13.2f} {many['first']:9.2f} {many['first'] / one['first']:6.2f}   "
              f"{many['own'] / one['own']:14.2f}")
    for mode, timings, _, _ in rows:
        print(f"{mode}: requests of the {args.hosts} hosts by kind: {timings[args.hosts]['requests']}")
    if built is not None:
        print(f"index built ahead: requests by kind: {built}")


if __name__ == "__main__":
    main()
