"""LitData's ``StreamingDataset`` / ``StreamingDataLoader``: ``loader.state_dict()``
after a step, ``loader.load_state_dict(state)`` on a new loader (its README's "Pause,
resume data streaming").

The data is written with ``litdata.optimize`` (its chunk format). LitData's stream has
per-item ``transform`` but no filter or flat map: those run where its docs put them,
in the ``optimize(fn=...)`` that writes the data set (a generator ``fn`` may yield no
item or several), so the resume reads the already filtered or flattened items. Packing
is its ``TokensLoader(block_size=...)`` over a token stream (concatenate, then cut
blocks). The mixture is ``CombinedStreamingDataset(weights=...)``. On another number of
hosts, every new rank loads a state of the old run and LitData restripes the rest (its
``StreamingDataset`` elastic resume: "Elastic resume rebuilds remaining IDs from that
first-run shuffler assignment").
"""

from __future__ import annotations

from typing import Any

import numpy as np

from resume import common
from resume.base import Column, OnHost
from resume.torch_cols import EpochRun


def item_id(item: dict) -> dict:
    return {"id": common.to_example(np.asarray(item["tokens"]))["id"]}


def item_id_b(item: dict) -> dict:
    return {"id": common.to_example(np.asarray(item["tokens"]))["id"] + common.B_OFFSET}


def item_plain(item: dict) -> dict:
    common.note_worker()
    return {"id": int(item["id"])}


def _ids(scenario: str, batch: Any) -> list[int]:
    if scenario == "packing":  # TokensLoader's blocks: a tensor of tokens
        return common.token_ids(batch.numpy())
    return [int(x) for x in batch["id"]]


class LitData(Column):
    name = "litdata"
    packages = ("litdata",)

    def fmt(self, scenario: str) -> str:
        return {"packing": "litdata_tokens", "filter": "litdata_filter",
                "flat_map": "litdata_flat_map"}.get(scenario, "litdata")

    def open(self, ctx: Any, state: Any) -> Any:
        if ctx.hosts == 1:
            return self._open(ctx, state)
        # LitData reads the world size and rank from WORLD_SIZE and GLOBAL_RANK.
        host = OnHost({"WORLD_SIZE": str(ctx.hosts), "GLOBAL_RANK": str(ctx.host)})
        with host:
            # Every rank's state counts the samples of all ranks (num_samples_yielded x
            # world_size); LitData restripes what is left over the new world size.
            return host.wrap(self._open(ctx, state[0] if isinstance(state, list) else state))

    def _open(self, ctx: Any, state: Any) -> EpochRun:
        import litdata
        from litdata.streaming.item_loader import TokensLoader

        sc = ctx.scenario
        transform = item_plain if sc in ("filter", "flat_map") else item_id
        if sc == "packing":
            ds: Any = litdata.StreamingDataset(ctx.data["a"], item_loader=TokensLoader(block_size=common.ROW),
                                               shuffle=True, seed=common.SEED, drop_last=False)
        else:
            ds = litdata.StreamingDataset(ctx.data["a"], shuffle=True, seed=common.SEED, drop_last=False,
                                          transform=transform)
        if sc == "mixture":
            b = litdata.StreamingDataset(ctx.data["b"], shuffle=True, seed=common.SEED, drop_last=False,
                                         transform=item_id_b)
            ds = litdata.CombinedStreamingDataset([ds, b], seed=common.SEED, weights=(0.3, 0.7),
                                                  iterate_over_all=False)
        batch = ctx.sizes.packed_batch if sc == "packing" else ctx.sizes.batch
        if sc == "elastic":
            batch = common.elastic_batch(ctx.sizes, ctx.hosts)
        loader = litdata.StreamingDataLoader(ds, batch_size=batch, num_workers=ctx.workers)
        return EpochRun(loader, sc, ctx.epochs, state, ids=_ids)
