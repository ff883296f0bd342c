"""granary's two columns: the ``DataLoader`` and the dataset API (``MapDataset`` chains).

Both checkpoint as the docs say: ``it.get_state()`` (a small JSON dict) after a step,
``loader.iterator(state)`` / ``it.set_state(state)`` in the new process; on another
host count, every old host's state (``loader.iterator(states)``, or Grain's
``ElasticIterator`` for the dataset API).
"""

from __future__ import annotations

import json
from typing import Any

from resume import common
from resume.base import Column


def _ids(scenario: str, batch: Any) -> list[int]:
    if scenario == "packing":
        return common.token_ids(batch["tokens"])
    return [int(x) for x in batch["id"]]


class _Run:
    def __init__(self, scenario: str, iterator: Any) -> None:
        self._scenario, self._it = scenario, iterator

    def __iter__(self):
        for batch in self._it:
            yield _ids(self._scenario, batch)

    def save(self) -> bytes:
        return json.dumps(self._it.get_state()).encode()

    def close(self) -> None:
        self._it.close()


def _state(state: Any) -> Any:
    if isinstance(state, list):
        return [json.loads(s) for s in state]
    return json.loads(state)


class GranaryLoader(Column):
    """``dl.DataLoader(source, IndexSampler(...), operations, worker_count=2)``."""

    name = "granary"
    packages = ("granary",)

    def open(self, ctx: Any, state: Any) -> _Run:
        import dataloader as dl

        sc, sizes = ctx.scenario, ctx.sizes
        source: Any = dl.ArrayRecordDataSource(ctx.data["a"])
        head = [dl.MapTransform(common.decode)]
        if sc == "mixture":
            # The DataLoader reads any random-access source: the dataset API's mixture is one.
            a = dl.MapDataset.source(source).map(common.decode)
            b = dl.MapDataset.source(dl.ArrayRecordDataSource(ctx.data["b"])).map(common.decode).map(common.shift_b)
            source, head = dl.MapDataset.mix([a, b], weights=[0.3, 0.7]), []
        batch = common.elastic_batch(sizes, ctx.hosts) if sc == "elastic" else sizes.batch
        middle: list[Any] = [dl.MapTransform(common.id_only), dl.Batch(batch)]
        if sc == "filter":
            middle.insert(0, dl.FilterTransform(common.keep))
        elif sc == "flat_map":
            middle.insert(0, dl.FlatMapTransform(common.fan_out, max_fan_out=3))
        elif sc == "packing":
            middle = [dl.MapTransform(common.tokens_only),
                      dl.FirstFitPack({"tokens": common.ROW}, num_packing_bins=4, seed=common.SEED),
                      dl.Batch(sizes.packed_batch)]
        sampler = dl.IndexSampler(
            len(source), shuffle=True, seed=common.SEED, num_epochs=ctx.epochs,
            shard_options=dl.ShardOptions(ctx.host, ctx.hosts),
        )
        loader = dl.DataLoader(source, sampler, head + middle, worker_count=ctx.workers)
        return _Run(sc, loader.iterator(_state(state)) if state is not None else iter(loader))


class GranaryDataset(Column):
    """``dl.MapDataset.source(...).seed(0).shuffle()...to_iter_dataset()...mp_prefetch(...)``."""

    name = "granary-dataset"
    packages = ("granary",)

    def open(self, ctx: Any, state: Any) -> Any:
        import dataloader as dl

        sc, sizes = ctx.scenario, ctx.sizes
        ds = dl.MapDataset.source(dl.ArrayRecordDataSource(ctx.data["a"])).map(common.decode)
        if sc == "mixture":
            b = dl.MapDataset.source(dl.ArrayRecordDataSource(ctx.data["b"])).map(common.decode).map(common.shift_b)
            ds = dl.MapDataset.mix([ds, b], weights=[0.3, 0.7])
        ds = ds.seed(common.SEED).shuffle()
        if ctx.epochs > 1:
            ds = ds.repeat(ctx.epochs)
        options = dl.MultiprocessingOptions(num_workers=ctx.workers)
        if sc == "elastic":
            it = dl.experimental.ElasticIterator(
                ds.map(common.id_only), common.elastic_batch(sizes, 1), dl.ShardOptions(ctx.host, ctx.hosts),
                multiprocessing_options=options,
            )
            if state is not None:
                # Any old host's state restores every new host (the docs' "Elastic restore").
                it.set_state(json.loads(state[0]))
            return _Run(sc, _Closing(it))
        stream = ds.to_iter_dataset()
        if sc == "filter":
            stream = stream.filter(common.keep)
        elif sc == "flat_map":
            stream = stream.flat_map(dl.FlatMapTransform(common.fan_out, max_fan_out=3))
        if sc == "packing":
            stream = stream.map(common.tokens_only).mp_prefetch(options)
            stream = dl.experimental.FirstFitPackIterDataset(
                stream, length_struct={"tokens": common.ROW}, num_packing_bins=4, seed=common.SEED)
            stream = stream.batch(sizes.packed_batch)
        else:
            stream = stream.map(common.id_only).batch(sizes.batch).mp_prefetch(options)
        it = iter(stream)
        if state is not None:
            it.set_state(json.loads(state))
        return _Run(sc, it)


class _Closing:
    """An ElasticIterator as a closable iterator (it has get_state/set_state, no close)."""

    def __init__(self, it: Any) -> None:
        self._it = it

    def __iter__(self):
        return self._it

    def get_state(self) -> Any:
        return self._it.get_state()

    def close(self) -> None:
        close = getattr(self._it, "close", None)
        if close is not None:
            close()
