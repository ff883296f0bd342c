"""One JAX process of an elastic run (test_elastic_multihost.py): restore, step, save.

The process reads its shard (``jax.process_index()`` of ``jax.process_count()``) of a
pipeline of ``tests/dataloader/engine/elastic_cases.py``. With ``--restore`` it first
restores that step of the Orbax checkpoint (``dl.CheckpointRestore``: written by another
number of processes, it hands the iterator every old process's state); it then
takes ``--steps`` steps (-1: to the end), saves with Orbax at step ``--save`` (if
given), and writes the record ids it used and its step count to ``--out``.

``--pipeline "end pad"`` is ``finite_multihost_main.py``'s loader (a filter that keeps
a different share of each shard, ``end="pad"``): the processes agree on the step count
through JAX's key-value store, and the ids are those of the real (unmasked) rows.

    python elastic_multihost_main.py --process-id 0 --processes 3 --port 12345 \\
        --pipeline filter --ckpt DIR --restore 3 --steps 2 --save 5 --out p0.json
"""

from __future__ import annotations

import argparse
import json

import jax


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--process-id", "--processes", "--port", "--steps"):
        parser.add_argument(name, type=int, required=True)
    parser.add_argument("--restore", type=int, default=None)
    parser.add_argument("--save", type=int, default=None)
    parser.add_argument("--pipeline", required=True)
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{args.port}", num_processes=args.processes,
                               process_id=args.process_id, initialization_timeout=60)
    import orbax.checkpoint as ocp

    import dataloader as dl
    from tests.dataloader.engine.elastic_cases import make_loader, record_ids

    if args.pipeline == "end pad":
        from tests.integration.finite_multihost_main import BATCH, RECORDS, keep, to_leaves

        loader = dl.DataLoader(
            dl.RangeDataSource(RECORDS), dl.IndexSampler(RECORDS, dl.ShardByJaxProcess(), num_epochs=1),
            [dl.MapTransform(to_leaves), dl.FilterTransform(keep), dl.Batch(BATCH)], end=dl.PadEnd(lookahead=2))
    else:
        loader = make_loader(args.pipeline, jax.process_index(), jax.process_count())
    it = iter(loader)
    if args.restore is not None:
        # On another process count, the restore hands the iterator every old process's
        # state (their files in this step of the checkpoint).
        with ocp.CheckpointManager(args.ckpt) as mngr:
            mngr.restore(args.restore, args=ocp.args.Composite(data=dl.CheckpointRestore(it)))
    used: list[int] = []
    taken = 0
    while args.steps < 0 or taken < args.steps:
        try:
            out = next(it)
        except StopIteration:
            break
        if args.pipeline == "end pad":
            used += out["record"][out["mask"]].tolist()
        else:
            used += record_ids(args.pipeline, out)
        taken += 1
    if args.save is not None:
        with ocp.CheckpointManager(args.ckpt) as mngr:
            mngr.save(args.save, args=ocp.args.Composite(data=dl.CheckpointSave(it)))
            mngr.wait_until_finished()
    with open(args.out, "w") as f:
        json.dump({"ids": used, "steps": taken, "state": it.get_state()}, f)
    it.close()
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
