"""Hugging Face ``datasets``: an ``IterableDataset`` (streamed from the Parquet files,
checkpointed with ``state_dict()`` through torchdata's ``StatefulDataLoader``, as its
``state_dict`` docstring shows), and a map-style ``Dataset`` with a sampler (the
``RandomSampler`` of ``StatefulDataLoader(shuffle=True, generator=...)``).

The pipeline is datasets' own: ``shuffle(seed, buffer_size)`` (shards and a buffer of a
tenth of the records) for the stream, ``map``/``filter``, a batched ``map`` for the
flat map and for packing (the concatenate-then-split "group_texts" of its language
modelling guides), ``interleave_datasets(probabilities=...)`` for the mixture, and
``set_epoch`` between epochs.
"""

from __future__ import annotations

import glob
import os
from typing import Any

from resume import common
from resume.torch_cols import EpochRun, OneRankColumn

ELASTIC = (
    "datasets documents IterableDataset.state_dict() for one dataset, i.e. one rank's "
    "split_dataset_by_node(ds, rank, world_size) share, and no way to resume it on another "
    "world size; torchdata: \"not across ranks\""
)


def add_id(example: dict) -> dict:
    common.note_worker()
    return {"id": int(example["tokens"][0]) - 1}


def keep(example: dict) -> bool:
    common.note_worker()
    return common.keep({"id": int(example["tokens"][0]) - 1})


def fan_out_batch(batch: dict) -> dict:
    common.note_worker()
    ids = [10 * (int(t[0]) - 1) + k for t in batch["tokens"] for k in range(1 + (int(t[0]) - 1) % 3)]
    return {"id": ids}


def shift_b(example: dict) -> dict:
    return {"id": int(example["tokens"][0]) - 1 + common.B_OFFSET}


def group_texts(batch: dict) -> dict:
    """Concatenate the batch's documents and cut rows of ROW tokens (the rest is kept
    as a short last row, padded with 0)."""
    common.note_worker()
    flat = [t for tokens in batch["tokens"] for t in tokens]
    rows = [flat[k:k + common.ROW] for k in range(0, len(flat), common.ROW)]
    return {"tokens": [r + [0] * (common.ROW - len(r)) for r in rows]}


def _pipeline(ds: Any, ctx: Any, other: Any = None) -> Any:
    """The scenario's operation on a datasets object (either kind); ``other`` is the
    mixture's second source."""
    from datasets import interleave_datasets

    sc = ctx.scenario
    if sc == "filter":
        return ds.filter(keep).map(add_id, remove_columns=["tokens"])
    if sc == "flat_map":
        return ds.map(fan_out_batch, batched=True, remove_columns=["tokens"])
    if sc == "packing":
        return ds.map(group_texts, batched=True)
    if sc == "mixture":
        a = ds.map(add_id, remove_columns=["tokens"])
        b = other.map(shift_b, remove_columns=["tokens"])
        return interleave_datasets([a, b], probabilities=[0.3, 0.7], seed=common.SEED,
                                   stopping_strategy="first_exhausted")
    return ds.map(add_id, remove_columns=["tokens"])


def collate(rows: list[dict]) -> dict:
    """The batch as tensors; it runs in the worker processes (so it marks them), where a
    map-style Dataset's map ran ahead in this process."""
    import torch

    common.note_worker()

    if "tokens" in rows[0]:
        return {"tokens": torch.tensor([r["tokens"] for r in rows])}
    return {"id": torch.tensor([r["id"] for r in rows])}


class HfIterable(OneRankColumn):
    name = "hf-iterable"
    packages = ("datasets", "torchdata")
    elastic = ELASTIC

    def open(self, ctx: Any, state: Any) -> EpochRun:
        from datasets import load_dataset
        from torchdata.stateful_dataloader import StatefulDataLoader

        def stream(pattern: str) -> Any:
            ds = load_dataset("parquet", data_files=sorted(glob.glob(pattern)), split="train", streaming=True)
            return ds.shuffle(seed=common.SEED, buffer_size=max(1, ctx.sizes.records // 10))

        other = stream(ctx.data["b"]) if ctx.scenario == "mixture" else None
        ds = _pipeline(stream(ctx.data["a"]), ctx, other)
        batch = ctx.sizes.packed_batch if ctx.scenario == "packing" else ctx.sizes.batch
        loader = StatefulDataLoader(ds, batch_size=batch, num_workers=ctx.workers, collate_fn=collate)
        return EpochRun(loader, ctx.scenario, ctx.epochs, state, before_epoch=ds.set_epoch)


class HfMap(OneRankColumn):
    name = "hf-map"
    packages = ("datasets", "torchdata")
    elastic = ELASTIC

    def open(self, ctx: Any, state: Any) -> EpochRun:
        import torch
        from datasets import Dataset
        from torchdata.stateful_dataloader import StatefulDataLoader

        cache = os.path.join(ctx.workdir, "hf-cache")

        def table(pattern: str) -> Any:
            return Dataset.from_parquet(sorted(glob.glob(pattern)), cache_dir=cache)

        other = table(ctx.data["b"]) if ctx.scenario == "mixture" else None
        ds = _pipeline(table(ctx.data["a"]), ctx, other)
        batch = ctx.sizes.packed_batch if ctx.scenario == "packing" else ctx.sizes.batch
        loader = StatefulDataLoader(ds, batch_size=batch, shuffle=True, num_workers=ctx.workers, collate_fn=collate,
                                    generator=torch.Generator().manual_seed(common.SEED))
        return EpochRun(loader, ctx.scenario, ctx.epochs, state)
