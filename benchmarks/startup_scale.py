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
slowest of H, from the barrier that releases every host after its imports, raw, and
with each host's time spent waiting for a CPU taken out (its main and I/O threads'
run-queue wait, from ``/proc/<pid>/task/*/schedstat``): on a 2-core machine, H processes
wait for each other's CPU, which H hosts with their own do not. It is also given from
the process start (the host's imports, timed for one host importing alone and for the
slowest of H importing at once, plus its start-up), with the share of the slowest
host's start-up spent waiting for a CPU and the CPU seconds one host used.

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
    the requests), found by their native ids (Python names its threads, not the
    kernel: every thread's ``comm`` reads ``python``). Other threads (array_record's
    idle pool) are not waited for."""
    import threading

    ids = {t.native_id for t in threading.enumerate()
           if t is threading.main_thread() or t.name.startswith("fsspecIO")}
    total = 0
    for tid in ids:
        with contextlib.suppress(OSError), open(f"/proc/self/task/{tid}/schedstat") as f:
            total += int(f.read().split()[1])
    return total / 1e9


def _host(rank: int, conn: Any, options: dict[str, Any], batch: int) -> None:
    """One host: imports (timed: wall and CPU), then for each run, its start-up and first
    batch, timed from the barrier that releases every host at once."""
    began, cpu = time.perf_counter(), time.process_time()
    logging.getLogger("botocore").setLevel(logging.ERROR)
    import fsspec

    import dataloader as dl
    from dataloader.device.remote_index import shared_array_record_source

    # Everything a start-up imports, imported before the barrier (fsspec imports s3fs,
    # and granary its engine, on first use): the barrier is after the imports.
    fsspec.get_filesystem_class("s3")
    assert dl.ArrayRecordDataSource is not None and dl.RemoteOptions is not None
    next(iter(dl.MapDataset.source(dl.RangeDataSource(8)).seed(0).shuffle()[0::2].batch(2).to_iter_dataset()))
    conn.send({"imports": time.perf_counter() - began, "imports_cpu": time.process_time() - cpu})
    while (job := conn.recv()) is not None:
        mode, hosts, run, folder = job
        glob = f"s3://{BUCKET}/{PREFIX}/*.array_record"
        index = f"s3://{BUCKET}/{PREFIX}/_granary_index.json"
        remote = dl.RemoteOptions(cache_dir=os.path.join(folder, f"cache-{run}-{rank}"), whole_file_bytes=0,
                                  storage_options=options)
        conn.recv()  # the start signal (the barrier): every host goes at once
        began, waited, cpu = time.perf_counter(), _cpu_wait_s(), time.process_time()
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
        seconds, waited, cpu = time.perf_counter() - began, _cpu_wait_s() - waited, time.process_time() - cpu
        source.close()
        conn.send({"ready": ready, "seconds": seconds, "cpu_wait": min(waited, seconds), "cpu": cpu,
                   "records": len(first)})


def _compiled_once() -> None:
    """Granary's modules compiled once, read by every host, as from an installed package.

    Where bytecode is not written (``PYTHONDONTWRITEBYTECODE``, as on the VM these runs
    were made on), every host would compile granary's modules from source again (about
    0.1 s of CPU each); a prefix folder of compiled modules, named in the environment the
    hosts inherit, is what an installed package's ``__pycache__`` gives."""
    import compileall
    import importlib

    prefix = os.path.join(tempfile.gettempdir(), f"startup-scale-pycache-{os.getuid()}")
    sys.pycache_prefix = os.environ["PYTHONPYCACHEPREFIX"] = prefix
    for name in ("dataloader", "dataloader.sources", "dataloader.samplers", "dataloader.operations"):
        compileall.compile_dir(os.path.dirname(importlib.import_module(name).__file__), quiet=1)


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

    _compiled_once()
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
        conns = [parent for parent, _ in pipes]
        # Host 0 imports alone (one host's imports), then the others all at once (H hosts').
        hosts[0].start()
        alone = conns[0].recv()
        for host in hosts[1:]:
            host.start()
        together = [alone, *(conn.recv() for conn in conns[1:])]
        imports = {1: alone["imports"], args.hosts: max(r["imports"] for r in together)}
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
                slowest = max(results, key=lambda r: r["seconds"])
                timings[count] = {
                    "ready": max(r["ready"] for r in results),
                    "first": slowest["seconds"],
                    "total": imports[count] + slowest["seconds"],
                    "own": max(r["seconds"] - r["cpu_wait"] for r in results),
                    "wait_share": slowest["cpu_wait"] / slowest["seconds"],
                    "cpu": max(r["cpu"] for r in results),
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
    print(f"\nseconds from process start (imports + start-up; imports {imports[1]:.2f} s for one host alone, "
          f"{imports[args.hosts]:.2f} s the slowest of {args.hosts} importing at once), the slowest host's share "
          f"of its start-up spent waiting for a CPU, and the most CPU one host used after the barrier")
    print(f"{'':26s} {'total: 1 host':>13s} {args.hosts:>3d} hosts {'ratio':>6s}   {'CPU wait: 1':>11s} "
          f"{args.hosts:>5d}   {'CPU s: 1':>8s} {args.hosts:>5d}")
    for mode, timings, _, _ in rows:
        one, many = timings[1], timings[args.hosts]
        print(f"{mode:26s} {one['total']:13.2f} {many['total']:9.2f} {many['total'] / one['total']:6.2f}   "
              f"{one['wait_share']:11.0%} {many['wait_share']:5.0%}   {one['cpu']:8.2f} {many['cpu']:5.2f}")
    for mode, timings, _, _ in rows:
        print(f"{mode}: requests of the {args.hosts} hosts by kind: {timings[args.hosts]['requests']}")
    if built is not None:
        print(f"index built ahead: requests by kind: {built}")


if __name__ == "__main__":
    main()
