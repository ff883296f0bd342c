"""Units on Ray actors beside the in-process path, the local pool and Ray Data.

The same decode on every row: ``--records`` PNG images (``--side`` pixels square, RGB
noise, made here with Pillow), read from an ArrayRecord file (``--source memory``: from
an ``InMemoryDataSource``, which every worker and actor then receives whole, pickled
with the pipeline), each decoded and normalised to float32, in batches of
``--batch``. Rows:

* ``in-process``: ``worker_count=0``;
* ``pool-2``: the local pool, 2 worker processes;
* ``ray-2``: :class:`dataloader.RayExecutor`, 2 actors on a Ray started on this machine;
* ``ray-data``: Ray Data's own pipeline, ``ray.data.from_items(...).map_batches(decode,
  batch_size=B).iter_batches(batch_size=B)``, on the same Ray.

Each row runs in a fresh interpreter (so no row's processes, Ray's included, outlive
it) and iterates the whole data set twice (two iterators of one loader); it reports
records/s (from ``iter()`` to the last batch), records/s from the first batch on
(steady state, start-up left out), the time to the first batch, the parent's CPU seconds per batch (``time.process_time()`` of the
training process, every thread of it, over the iteration: what feeding costs the
trainer; the digest's own time is taken out of both), and whether the two runs gave the same batches in the same order (a digest
of every batch). Starting Ray itself (``ray.init``) is reported apart, as ``start_s``.

Needs Ray, Ray Data (pandas) and Pillow, which ``benchmarks/setup_env.sh`` installs.

    benchmarks/.venv/bin/python benchmarks/ray_executor.py
    benchmarks/.venv/bin/python benchmarks/ray_executor.py --records 4000 --side 96
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks.* by name

ROWS = ("in-process", "pool-2", "ray-2", "ray-data")


def make_records(n: int, side: int) -> list[bytes]:
    from PIL import Image

    rng = np.random.default_rng(0)
    out = []
    for _ in range(n):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)).save(buf, "PNG")
        out.append(buf.getvalue())
    return out


def decode(record: bytes) -> np.ndarray:
    """PNG bytes -> HxWx3 float32 in [0, 1]: the work every row does per record."""
    from PIL import Image

    with Image.open(io.BytesIO(record)) as image:
        return np.asarray(image, dtype=np.float32) / 255.0


def decode_batch(batch: dict) -> dict:
    """Ray Data's form of :func:`decode`: a batch of records in, a batch of images out."""
    return {"image": np.stack([decode(r) for r in batch["record"]])}


def one_pass(make_iter, n_records: int) -> dict:
    """Iterates once; the figures of this pass."""
    cpu0, t0 = time.process_time(), time.perf_counter()
    it = make_iter()
    hashes, first, batches, records = hashlib.sha256(), None, 0, 0
    hash_wall = hash_cpu = hash1 = 0.0
    t1 = t0  # the digest's own cost, taken out of the figures
    for b in it:
        if first is None:
            first = time.perf_counter() - t0
        h0, c0 = time.perf_counter(), time.process_time()
        hashes.update(np.ascontiguousarray(b).tobytes())
        hash_wall += time.perf_counter() - h0
        hash_cpu += time.process_time() - c0
        batches += 1
        records += len(b)
        if batches == 1:  # steady state: from the first batch on
            t1, hash1 = time.perf_counter(), hash_wall
    wall = time.perf_counter() - t0 - hash_wall
    steady = time.perf_counter() - t1 - (hash_wall - hash1)
    cpu = time.process_time() - cpu0 - hash_cpu
    close = getattr(it, "close", None)
    if close is not None:
        close()
    assert records == n_records, (records, n_records)
    first_size = n_records / batches  # about: every batch but the last is full
    return {"records_per_s": records / wall, "first_batch_s": first,
            "steady_records_per_s": (records - first_size) / steady if steady > 0 else 0.0, "parent_cpu_per_batch_ms":
            1e3 * cpu / batches, "batches": batches, "digest": hashes.hexdigest()[:16]}


def measure(row: str, n: int, side: int, batch: int, source: str = "file") -> dict:
    import tempfile

    import dataloader as dl

    records = make_records(n, side)
    folder = tempfile.TemporaryDirectory()
    if source == "file":  # what a cluster reads: files every node can open
        path = f"{folder.name}/images.array_record"
        dl.write_array_record(path, records)

        def data() -> object:
            return dl.ArrayRecordDataSource(path)
    else:  # the records inside the pipeline: pickled into every worker / actor

        def data() -> object:
            return dl.InMemoryDataSource(records)
    start_s = 0.0
    if row.startswith("ray"):
        import ray

        t = time.perf_counter()
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 object_store_memory=256 * 2**20)
        start_s = time.perf_counter() - t

    def loader(**kw):
        return dl.DataLoader(data(), dl.IndexSampler(n, num_epochs=1),
                             [dl.MapTransform(decode), dl.Batch(batch)], **kw)

    # One loader per row, iterated twice: a training job builds its loader once (the
    # plan, with the records of this in-memory source, is pickled once, and the pool's
    # fork server started once); each pass is a new iterator.
    if row == "in-process":
        make = loader().__iter__
    elif row == "pool-2":
        make = loader(worker_count=2).__iter__
    elif row == "ray-2":
        executor = dl.RayExecutor(num_workers=2)
        make = loader(executor=executor).__iter__
    else:
        import ray

        def make():
            ds = ray.data.from_items([{"record": r} for r in records])
            ds = ds.map_batches(decode_batch, batch_size=batch)
            return (b["image"] for b in ds.iter_batches(batch_size=batch, batch_format="numpy"))

    passes = [one_pass(make, n) for _ in range(2)]
    if row.startswith("ray"):
        import ray

        ray.shutdown()
    folder.cleanup()
    return {"ok": True, "row": row, "start_s": start_s, "passes": passes,
            "identical": passes[0]["digest"] == passes[1]["digest"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--side", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--source", choices=("file", "memory"), default="file",
                        help="file: an ArrayRecord file (the default); memory: the records in an "
                        "InMemoryDataSource, so the pipeline every worker and actor receives "
                        "carries the whole data set")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        request = json.loads(args.measure)
        print(json.dumps(measure(request["row"], request["records"], request["side"], request["batch"],
                                 request.get("source", "file"))))
        return
    from benchmarks.bench_env import run_row

    header = (f"{'row':<11} {'start s':>7} {'rec/s 1':>8} {'rec/s 2':>8} {'steady rec/s 1/2':>16} "
              f"{'1st batch s':>11} {'parent CPU ms/batch':>19} {'same output':>11}")
    print(f"{args.records} PNG records {args.side}x{args.side}x3 ({args.source}), batches of {args.batch}")
    print(header)
    results = []
    for row in args.rows.split(","):
        request = {"row": row, "records": args.records, "side": args.side, "batch": args.batch,
                   "source": args.source}
        r = run_row(__file__, request, timeout=900)
        r.setdefault("row", row)
        results.append(r)
        if not r.get("ok"):
            print(f"{row:<11} failed: {r.get('reason')}")
            continue
        p1, p2 = r["passes"]
        steady = f"{p1['steady_records_per_s']:.0f}/{p2['steady_records_per_s']:.0f}"
        print(f"{row:<11} {r['start_s']:>7.2f} {p1['records_per_s']:>8.0f} {p2['records_per_s']:>8.0f} "
              f"{steady:>16} "
              f"{p1['first_batch_s']:>5.2f}/{p2['first_batch_s']:<5.2f} "
              f"{p1['parent_cpu_per_batch_ms']:>9.2f}/{p2['parent_cpu_per_batch_ms']:<9.2f} "
              f"{'yes' if r['identical'] else 'NO':>11}")
    digests = {r["row"]: r["passes"][0]["digest"] for r in results if r.get("ok")}
    print("digests of the first pass:", json.dumps(digests))


if __name__ == "__main__":
    main()
