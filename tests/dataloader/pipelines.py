"""Pipelines that cover every operation and unit layout, shared by loader tests.

Functions live at module level so child processes can import them; each pipeline is
named for what it exercises.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

import dataloader as dl


def add_noise(x, rng):
    return {"x": x["x"], "noise": rng.integers(0, 1_000_000)}


def as_dict(x):
    return {"x": np.asarray([x, x * 2], dtype=np.int64)}


def keep_not_multiple_of_3(x):
    return int(x["x"][0]) % 3 != 0


def repeat_by_mod(x):
    # 0, 1 or 2 copies: exercises empty fan-out and multi-output positions.
    return [{"x": x["x"] + i} for i in range(int(x["x"][0]) % 3)]


def split_batch(batch):
    half = len(batch["x"]) // 2
    return [{k: v[:half] for k, v in batch.items()}, {k: v[half:] for k, v in batch.items()}]


def batch_is_even_sum(batch):
    return int(batch["x"].sum()) % 2 == 0


def scale_batch(batch):
    return {k: v * 3 for k, v in batch.items()}


PIPELINES = {
    "no_ops": lambda: [],
    "map": lambda: [dl.MapTransform(as_dict)],
    "batch": lambda: [dl.MapTransform(as_dict), dl.Batch(4)],
    "batch_drop_remainder": lambda: [dl.MapTransform(as_dict), dl.Batch(4, drop_remainder=True)],
    "random_map_batch": lambda: [
        dl.MapTransform(as_dict), dl.RandomMapTransform(add_noise), dl.Batch(3)
    ],
    "filter": lambda: [dl.MapTransform(as_dict), dl.FilterTransform(keep_not_multiple_of_3)],
    "flat_map": lambda: [dl.MapTransform(as_dict), dl.FlatMapTransform(repeat_by_mod, max_fan_out=2)],
    "random_map": lambda: [dl.MapTransform(as_dict), dl.RandomMapTransform(add_noise)],
    "filter_batch": lambda: [
        dl.MapTransform(as_dict), dl.FilterTransform(keep_not_multiple_of_3), dl.Batch(4)
    ],
    "flat_map_batch_drop": lambda: [
        dl.MapTransform(as_dict), dl.FlatMapTransform(repeat_by_mod, max_fan_out=2),
        dl.Batch(5, drop_remainder=True),
    ],
    "everything": lambda: [
        dl.MapTransform(as_dict), dl.FilterTransform(keep_not_multiple_of_3),
        dl.FlatMapTransform(repeat_by_mod, max_fan_out=2), dl.RandomMapTransform(add_noise),
        dl.Batch(4), dl.MapTransform(scale_batch), dl.RandomMapTransform(lambda b, rng: {**b, "r": rng.random()}),
    ],
    "batch_then_flat_map": lambda: [
        dl.MapTransform(as_dict), dl.Batch(4), dl.FlatMapTransform(split_batch)
    ],
    "batch_then_filter": lambda: [
        dl.MapTransform(as_dict), dl.Batch(3), dl.FilterTransform(batch_is_even_sum)
    ],
    "filter_batch_then_flat_map": lambda: [
        dl.MapTransform(as_dict), dl.FilterTransform(keep_not_multiple_of_3), dl.Batch(4),
        dl.FlatMapTransform(split_batch),
    ],
}


def make_loader(name: str, *, n: int = 23, epochs: int | None = 3, shard=(0, 1), worker_count=0, **kw):
    sampler = dl.IndexSampler(
        n, shard_options=dl.ShardOptions(*shard), shuffle=True, seed=7, num_epochs=epochs
    )
    return dl.DataLoader(
        data_source=dl.RangeDataSource(n), sampler=sampler, operations=PIPELINES[name](),
        worker_count=worker_count, **kw,
    )


class SlowStorage:
    """Records ``0..n-1`` behind a latency per read call, like a remote file system (the
    advice's ``io_wait`` rule: reading that waits, not computes)."""

    def __init__(self, n: int, latency_s: float) -> None:
        self.n, self.latency_s = n, latency_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return self.__getitems__([i])[0]

    def __getitems__(self, keys: Any) -> list[int]:
        time.sleep(self.latency_s)
        return [int(k) for k in keys]
