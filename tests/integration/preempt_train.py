"""A small training job that test_preemption.py SIGKILLs and restarts.

It trains a numpy "model" (a running sum of the batches) for ``--steps`` steps, saving
parameters and the data iterator with an Orbax CheckpointManager every ``--every``
steps, and restores from the latest complete checkpoint when it starts. For every
step it appends ``"<step> <fingerprint of the batch>"`` to ``--log`` (one ``os.write``
per line, so a SIGKILL never leaves half a line).

Hooks the test kills it at, by environment variable:

* ``PREEMPT_HANG_AT=N``: after step N's batch (and after waiting for pending saves),
  print ``hanging N`` and sleep: a kill between saves.
* ``PREEMPT_HANG_IN_SAVE=N``: inside the save of step N (after Orbax created the
  step's temporary directory, before the data state is committed), print
  ``in save N`` and sleep: a kill during a save.

Printed lines the test reads: ``start N`` (N = the step restored, 0 without a
checkpoint), ``saved N``, ``done``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time

import numpy as np

import dataloader as dl

RECORD_BYTES = 16


def make_loader(data: str, workers: int) -> dl.DataLoader:
    """The pipeline: decode, a random map, batches of 8; the stream repeats for ever."""
    source = dl.ArrayRecordDataSource(data)
    sampler = dl.IndexSampler(len(source), shuffle=True, seed=5, num_epochs=None)
    return dl.DataLoader(
        source,
        sampler,
        [dl.MapTransform(decode), dl.RandomMapTransform(add_noise), dl.Batch(8, drop_remainder=True)],
        worker_count=workers,
    )


def decode(record: bytes) -> np.ndarray:
    return np.frombuffer(record, dtype=np.uint8).astype(np.float32)


def add_noise(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return x + rng.standard_normal(x.shape).astype(np.float32)


def fingerprint(batch) -> str:
    return hashlib.sha256(np.ascontiguousarray(np.asarray(batch)).tobytes()).hexdigest()[:16]


def _hook_saves(hang_in_save: int | None, current: list[int]) -> None:
    """Makes the data item's save sleep at step ``hang_in_save``."""
    if hang_in_save is None:
        return
    handler = dl.IteratorCheckpointHandler
    original = handler.async_save

    async def async_save(self, directory, args):
        if current[0] == hang_in_save:
            print(f"in save {hang_in_save}", flush=True)
            time.sleep(600)
        return await original(self, directory, args)

    handler.async_save = async_save


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--data", "--ckpt", "--log"):
        parser.add_argument(name, required=True)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--every", type=int, default=4)
    parser.add_argument("--device", action="store_true")
    parser.add_argument("--asynchronous", action="store_true")
    args = parser.parse_args()
    hang_at = int(os.environ.get("PREEMPT_HANG_AT", -1))
    hang_in_save = os.environ.get("PREEMPT_HANG_IN_SAVE")
    current = [0]
    _hook_saves(int(hang_in_save) if hang_in_save else None, current)

    import orbax.checkpoint as ocp

    mngr = ocp.CheckpointManager(
        args.ckpt, options=ocp.CheckpointManagerOptions(enable_async_checkpointing=args.asynchronous)
    )
    loader = make_loader(args.data, args.workers)
    it = dl.device_prefetch(iter(loader)) if args.device else iter(loader)
    params = {"sum": np.zeros(RECORD_BYTES, np.float32)}
    start = mngr.latest_step() or 0
    if start:
        restored = mngr.restore(start, args=ocp.args.Composite(
            params=ocp.args.StandardRestore(params), data=dl.CheckpointRestore(it)))
        params = restored.params
    print(f"start {start}", flush=True)
    log = os.open(args.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    for step in range(start, args.steps):
        batch = np.asarray(next(it))
        os.write(log, f"{step} {fingerprint(batch)}\n".encode())
        params = {"sum": params["sum"] + batch.sum(axis=0)}
        done = step + 1
        if done % args.every == 0:
            current[0] = done
            mngr.save(done, args=ocp.args.Composite(
                params=ocp.args.StandardSave(params), data=dl.CheckpointSave(it)))
            print(f"saved {done}", flush=True)
        if done == hang_at:
            mngr.wait_until_finished()
            print(f"hanging {done}", flush=True)
            time.sleep(600)
    mngr.wait_until_finished()
    os.close(log)
    it.close()
    print("done", flush=True)


if __name__ == "__main__":
    sys.exit(main())
