"""What a state's fingerprint costs: per step (with and without, 0 and 2 workers) and per restore.

::

    python3 benchmarks/fingerprint.py               # ~1-2 minutes
    python3 benchmarks/fingerprint.py --records 20000 --repeat 3

Every row runs in this one process, side by side, on the same in-memory records
(1 KiB of bytes each, decoded to a uint8 array, batches of 64; a second pipeline
filters half of the records out before the batch, so batches are regrouped in the
training process). Rows with and without fingerprints alternate within each repeat,
and the median of the repeats is printed, so the machine's noise falls on both alike.

Printed:

- **steps/s** of iterating the loader (``next`` only), fingerprints on and off;
- **get_state** microseconds per call (a checkpoint, or the device feed, which asks for
  the state of every batch it prefetches): with a fingerprint the training process slices
  the digests the unit brought and encodes a few hundred bytes;
- **audit_log** steps/s with one JSON line written per step;
- **hashing** microseconds per batch where the unit is computed (a worker's cost);
- **restore** milliseconds of ``loader.iterator(state)`` up to the first batch, with
  ``verify_on_restore`` on (re-reads the last step: one batch; with workers, the workers
  compute it and the stream goes on from its units) and off, 0 and 2 workers (2: the
  pool's start included).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import dataloader as dl
from dataloader.engine import digest

RECORD_BYTES = 1024
BATCH = 64


def decode(record: bytes) -> np.ndarray:
    return np.frombuffer(record, dtype=np.uint8)


def keep_even_first_byte(x: np.ndarray) -> bool:
    return int(x[0]) % 2 == 0


def make_records(n: int) -> list[bytes]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, RECORD_BYTES, dtype=np.uint8).tobytes() for _ in range(n)]


def loader(records, pipeline: str, workers: int, **kw) -> dl.DataLoader:
    ops = [dl.MapTransform(decode)]
    if pipeline == "filter":
        ops.append(dl.FilterTransform(keep_even_first_byte))
    ops.append(dl.Batch(BATCH))
    sampler = dl.IndexSampler(len(records), shuffle=True, seed=0, num_epochs=None)
    return dl.DataLoader(dl.InMemoryDataSource(records), sampler, ops, worker_count=workers, **kw)


def steps_per_s(ld: dl.DataLoader, steps: int, state_every_step: bool = False) -> tuple[float, float]:
    """Steps per second, and the training thread's CPU microseconds per step (what the
    step costs this process, whatever the workers' share of the machine's cores)."""
    it = iter(ld)
    for _ in range(10):  # warm: workers up, buffers full
        next(it)
    began, cpu = time.perf_counter(), time.thread_time()
    for _ in range(steps):
        next(it)
        if state_every_step:
            it.get_state()
    rate = steps / (time.perf_counter() - began)
    cpu_us = (time.thread_time() - cpu) / steps * 1e6
    it.close()
    return rate, cpu_us


def get_state_us(ld: dl.DataLoader, calls: int = 2000) -> float:
    it = iter(ld)
    for _ in range(5):
        next(it)
    began = time.perf_counter()
    for _ in range(calls):
        it.get_state()
    us = (time.perf_counter() - began) / calls * 1e6
    it.close()
    return us


def hashing_us(records, pipeline: str, units: int = 50) -> float:
    """The digests a unit adds where it is computed: its records' and its outputs'."""
    ld = loader(records, pipeline, 0)
    batch = next(iter(ld))
    chunk = records[: BATCH * (2 if pipeline == "filter" else 1)]
    outputs = [batch] if pipeline == "batch" else [decode(r) for r in chunk if keep_even_first_byte(decode(r))]
    began = time.perf_counter()
    for _ in range(units):
        digest.digests(chunk)
        digest.digests(outputs)
    return (time.perf_counter() - began) / units * 1e6


def restore_ms(records, pipeline: str, workers: int, verify: bool, repeats: int = 20) -> float:
    ld = loader(records, pipeline, workers, verify_on_restore=verify)
    it = iter(ld)
    for _ in range(7):
        next(it)
    state = it.get_state()
    it.close()
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        restored = ld.iterator(state)
        next(restored)
        times.append(time.perf_counter() - began)
        restored.close()
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=20000)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    records = make_records(args.records)
    print(f"{args.records} records of {RECORD_BYTES} B, batches of {BATCH}, median of {args.repeat}; "
          f"{os.cpu_count()} CPUs", flush=True)

    print("\nper step: steps/s of next() (higher is better), and in [] the training thread's CPU us/step")
    print("  off: fingerprint=False; on: the default; on+state: get_state() after every step;")
    print("  on+log: audit_log=path (one JSON line per step)")
    print(f"{'pipeline':<8} {'workers':>7} {'off':>16} {'on':>16} {'on+state':>16} {'on+log':>16} {'on/off':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        for pipeline in ("batch", "filter"):
            for workers in (0, 2):
                rows: dict[str, list[tuple[float, float]]] = {"off": [], "on": [], "state": [], "log": []}
                for r in range(args.repeat):
                    rows["off"].append(steps_per_s(loader(records, pipeline, workers, fingerprint=False), args.steps))
                    rows["on"].append(steps_per_s(loader(records, pipeline, workers), args.steps))
                    rows["state"].append(steps_per_s(loader(records, pipeline, workers), args.steps, True))
                    log = os.path.join(tmp, f"log-{pipeline}-{workers}-{r}")
                    rows["log"].append(steps_per_s(loader(records, pipeline, workers, audit_log=log), args.steps))
                med = {k: (statistics.median(r for r, _ in v), statistics.median(c for _, c in v))
                       for k, v in rows.items()}
                cells = " ".join(f"{f'{r:.0f} [{c:.0f}]':>16}" for r, c in med.values())
                print(f"{pipeline:<8} {workers:>7} {cells} {med['on'][0] / med['off'][0]:>7.2f}", flush=True)

    print("\nin the training process: get_state() microseconds per call")
    print(f"{'pipeline':<8} {'off':>8} {'on':>8}")
    for pipeline in ("batch", "filter"):
        off = statistics.median(get_state_us(loader(records, pipeline, 0, fingerprint=False)) for _ in range(args.repeat))
        on = statistics.median(get_state_us(loader(records, pipeline, 0)) for _ in range(args.repeat))
        print(f"{pipeline:<8} {off:>8.1f} {on:>8.1f}", flush=True)

    print("\nwhere the unit is computed (a worker): hashing microseconds per batch")
    for pipeline in ("batch", "filter"):
        print(f"{pipeline:<8} {hashing_us(records, pipeline):>8.0f}", flush=True)

    print("\nper restore: milliseconds of loader.iterator(state) + its first batch")
    print(f"{'pipeline':<8} {'workers':>7} {'verify off':>10} {'verify on':>10}")
    for pipeline in ("batch", "filter"):
        for workers in (0, 2):
            repeats = 20 if workers == 0 else 8  # a pool's start is ~0.3 s
            off = restore_ms(records, pipeline, workers, False, repeats)
            on = restore_ms(records, pipeline, workers, True, repeats)
            print(f"{pipeline:<8} {workers:>7} {off:>10.2f} {on:>10.2f}", flush=True)


if __name__ == "__main__":
    main()
