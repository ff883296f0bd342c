"""One JAX process of a multi-host MaxText pipeline run, started by ``test_maxtext_multihost.py``.

Joins JAX's runtime (2 CPU devices per process), builds MaxText's training stream as
global arrays (``dl.maxtext.train_iterator``) and the eval pass stepped together across
hosts (``EvalBatches`` behind the device feed), and writes what it holds to JSON.

    python maxtext_main.py --process-id 0 --processes 2 --port 12345 --data DIR --out p0.json
"""

from __future__ import annotations

import argparse
import itertools
import json

import jax
import numpy as np

LOCAL_DEVICES = 2
PER_DEVICE = 2
LENGTH = 24
TRAIN_STEPS = 3


def keys(data: str) -> dict:
    return {"grain_train_files": f"{data}/train-*.array_record", "grain_eval_files": f"{data}/eval.array_record",
            "tokenizer_path": f"{data}/tokenizer.json", "tokenizer_type": "huggingface",
            "max_target_length": LENGTH, "per_device_batch_size": PER_DEVICE, "grain_worker_count": 0,
            "data_shuffle_seed": 4}


def local_rows(leaf) -> list:
    """(first global row, rows) of each slice of a global array that this process holds."""
    return sorted([s.index[0].start or 0, np.asarray(s.data).tolist()] for s in leaf.addressable_shards)


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--process-id", "--processes", "--port"):
        parser.add_argument(name, type=int, required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    jax.config.update("jax_num_cpu_devices", LOCAL_DEVICES)
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{args.port}", num_processes=args.processes,
                               process_id=args.process_id, initialization_timeout=60)
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    import dataloader as dl

    config = dl.maxtext.parse_maxtext_config(keys(args.data))
    train = dl.maxtext.train_iterator(config)
    report: dict = {"train": []}
    for batch in itertools.islice(train, TRAIN_STEPS):
        report["train"].append({"shape": list(batch["inputs"].shape),
                                "inputs": local_rows(batch["inputs"]),
                                "targets_segmentation": local_rows(batch["targets_segmentation"])})
    train.close()
    per_host = PER_DEVICE * jax.device_count() // jax.process_count()
    sharding = NamedSharding(Mesh(np.array(jax.devices()), ("data",)), PartitionSpec("data"))
    batches = dl.maxtext.EvalBatches(iter(dl.maxtext.eval_dataset(config)), batch_size=per_host, length=LENGTH)
    report["eval"] = []
    with dl.device_prefetch(batches, sharding) as it:
        for batch in it:
            report["eval"].append({"shape": list(batch["inputs"].shape), "mask": local_rows(batch["mask"]),
                                   "inputs": local_rows(batch["inputs"])})
    report["padding_batches"] = batches.padding_batches
    with open(args.out, "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
