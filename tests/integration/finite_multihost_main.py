"""One JAX process of a finite run that must end together, started by
``test_finite_multihost.py``.

Joins JAX's multi-process runtime on CPU, reads its shard (``ShardByJaxProcess``, in
order, no shuffle) through a filter that keeps a different share of each shard, batches
with ``end="pad"`` and feeds a device iterator over a mesh of every process's devices,
so every step is one global ``jax.Array`` (which only works if every process brings a
batch of the same shape at every step). Writes, for each step, this process's rows of
``record`` and ``mask``; then the state after ``--save-after`` steps and the steps of a
second iterator restored from it.

    python finite_multihost_main.py --process-id 0 --processes 2 --port 12345 --out p0.json
"""

from __future__ import annotations

import argparse
import json

import jax
import numpy as np

LOCAL_DEVICES = 2
RECORDS = 60
BATCH = 4  # per process


def keep(element) -> bool:
    """Shard h of H reads x = h mod H (no shuffle): shards keep different shares."""
    x = int(element["record"])
    return x % 4 == 0 or x % 3 == 1 or x < 8


def to_leaves(x):
    return {"record": np.int32(x)}


def local_rows(batch) -> dict:
    """This process's rows of each global leaf, in global row order."""
    out = {}
    for name, leaf in batch.items():
        shards = sorted((s.index[0].start or 0, np.asarray(s.data).tolist()) for s in leaf.addressable_shards)
        out[name] = [[start + i, v] for start, values in shards for i, v in enumerate(values)]
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--process-id", type=int, required=True)
    parser.add_argument("--processes", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--save-after", type=int, required=True)
    parser.add_argument("--lookahead", type=int, default=2)
    args = parser.parse_args()

    jax.config.update("jax_num_cpu_devices", LOCAL_DEVICES)
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{args.port}", num_processes=args.processes,
        process_id=args.process_id, initialization_timeout=60,
    )
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    import dataloader as dl

    sharding = NamedSharding(Mesh(np.array(jax.devices()), ("data",)), PartitionSpec("data"))
    loader = dl.DataLoader(
        dl.RangeDataSource(RECORDS),
        dl.IndexSampler(RECORDS, dl.ShardByJaxProcess(), num_epochs=1),
        [dl.MapTransform(to_leaves), dl.FilterTransform(keep), dl.Batch(BATCH)],
        end=dl.PadEnd(lookahead=args.lookahead),
    )
    result: dict = {"process_index": jax.process_index(), "steps": [], "restored": []}
    with dl.device_prefetch(loader, sharding) as it:
        for k, batch in enumerate(it, start=1):
            assert batch["record"].shape == (BATCH * args.processes,)
            result["steps"].append(local_rows(batch))
            if k == args.save_after:
                # The state is the last step's, whatever the feed has read ahead (near the
                # end the buffers cannot fill, so this does not wait for them).
                result["state"] = it.get_state()
    with dl.device_prefetch(loader.iterator(), sharding) as it:
        it.set_state(result["state"])
        result["restored"] = [local_rows(batch) for batch in it]
    with open(args.out, "w") as f:
        json.dump(result, f)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
