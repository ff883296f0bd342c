"""One of two JAX processes saving the loader's state with Orbax (test_orbax_multihost.py).

Each process reads its shard (``ShardByJaxProcess``, batch 4), takes ``--batches``
batches, saves them with a CheckpointManager at that step, and writes its state and its
next batches to ``--out``.

    python orbax_multihost_main.py --process-id 0 --processes 2 --port 12345 --ckpt DIR --out p0.json
"""

from __future__ import annotations

import argparse
import json

import jax

RECORDS, BATCH = 64, 4


def make_loader():
    import dataloader as dl

    sampler = dl.IndexSampler(RECORDS, dl.ShardByJaxProcess(drop_remainder=True), shuffle=True,
                              num_epochs=1, seed=9)
    return dl.DataLoader(dl.RangeDataSource(RECORDS), sampler, [dl.Batch(BATCH, drop_remainder=True)])


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--process-id", "--processes", "--port", "--batches"):
        parser.add_argument(name, type=int, required=True)
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{args.port}", num_processes=args.processes,
                               process_id=args.process_id, initialization_timeout=60)
    import orbax.checkpoint as ocp

    import dataloader as dl

    it = iter(make_loader())
    for _ in range(args.batches):
        next(it)
    with ocp.CheckpointManager(args.ckpt, options=ocp.CheckpointManagerOptions(
            enable_async_checkpointing=True)) as mngr:
        mngr.save(args.batches, args=ocp.args.Composite(data=dl.CheckpointSave(it)))
        mngr.wait_until_finished()
    with open(args.out, "w") as f:
        json.dump({"state": it.get_state(), "next": [b.tolist() for b in it]}, f)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
