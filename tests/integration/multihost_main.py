"""One JAX process of a multi-host run, started by ``test_multihost.py``.

Joins JAX's multi-process runtime (``jax.distributed.initialize``, CPU devices), reads
its shard with ``ShardByJaxProcess``, feeds a device iterator over a mesh of every
process's devices, and writes what it saw to a JSON file: for each global batch, the
slices of the global array that this process holds and their values. Optionally saves
the state after some batches (with both buffers full), and runs a second iterator
restored from a given state.

    python multihost_main.py --process-id 0 --processes 2 --port 12345 --batch 6 --out p0.json
"""

from __future__ import annotations

import argparse
import json

import jax
import numpy as np

from tests.helpers import wait_full

LOCAL_DEVICES = 2
RECORDS = 96


def to_leaves(x):
    return {"record": np.int32(x), "pair": np.array([x, -x], np.int32)}


def local_view(batch) -> dict:
    """The slices of each global leaf that live on this process, with their values."""
    out = {}
    for name, leaf in batch.items():
        out[name] = sorted(
            [shard.index[0].start or 0, np.asarray(shard.data).tolist()]
            for shard in leaf.addressable_shards
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--process-id", type=int, required=True)
    parser.add_argument("--processes", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True, help="per-process batch size")
    parser.add_argument("--out", required=True)
    parser.add_argument("--save-after", type=int, default=0, help="save the state after k batches")
    parser.add_argument("--restore", help="JSON file of a state to continue from (second run)")
    parser.add_argument("--skip-epoch", action="store_true", help="only the restored run")
    args = parser.parse_args()

    jax.config.update("jax_num_cpu_devices", LOCAL_DEVICES)
    if args.processes > 1:
        jax.distributed.initialize(
            coordinator_address=f"127.0.0.1:{args.port}",
            num_processes=args.processes,
            process_id=args.process_id,
            initialization_timeout=60,
        )
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    import dataloader as dl

    mesh = Mesh(np.array(jax.devices()), ("data",))
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    loader = dl.DataLoader(
        dl.RangeDataSource(RECORDS),
        dl.IndexSampler(RECORDS, dl.ShardByJaxProcess(drop_remainder=True), shuffle=True,
                        num_epochs=1, seed=5),
        [dl.MapTransform(to_leaves), dl.Batch(args.batch, drop_remainder=True)],
    )
    result: dict = {
        "process_index": jax.process_index(),
        "process_count": jax.process_count(),
        "device_count": jax.device_count(),
    }
    if not args.skip_epoch:
        batches = []
        with dl.device_prefetch(loader, sharding) as it:
            for k, batch in enumerate(it, start=1):
                leaf = batch["record"]
                result["global_shape"] = list(leaf.shape)
                result["fully_addressable"] = leaf.is_fully_addressable
                result["same_sharding"] = leaf.sharding == sharding
                batches.append(local_view(batch))
                if k == args.save_after:
                    wait_full(it)
                    result["state"] = it.get_state()
        result["epoch"] = batches
    if args.restore:
        with open(args.restore) as f:
            state = json.load(f)
        with dl.device_prefetch(loader.iterator(), sharding) as it:
            it.set_state(state)
            result["restored"] = [local_view(batch) for batch in it]
    with open(args.out, "w") as f:
        json.dump(result, f)
    if args.processes > 1:
        jax.distributed.shutdown()


if __name__ == "__main__":
    main()
