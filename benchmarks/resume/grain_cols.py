"""Grain 0.2.18's two columns: ``grain.python.DataLoader`` and the dataset API.

Checkpointing as Grain documents it: the DataLoader's iterator ``get_state()`` (JSON
bytes) and ``set_state()`` on a new iterator of the same loader; the dataset API's
``DatasetIterator.get_state()/set_state()``; on another shard count,
``grain.experimental.ElasticIterator`` (any shard's state restores every shard).
"""

from __future__ import annotations

import glob
import json
from typing import Any

from resume import common
from resume.base import Column
from resume.granary_cols import _Closing, _ids

ELASTIC_DOC = (
    "Grain's DataLoader state holds per-worker positions of one shard "
    "({'last_seen_indices', 'last_worker_index', 'worker_count', 'sampler', ...}); "
    "Grain documents elastic restore only for grain.experimental.ElasticIterator "
    "(\"Iterator supporting recovery from a checkpoint after changes in sharding\"), "
    "which is the dataset API column's"
)


def _grain() -> tuple[Any, Any, Any]:
    """(grain.python, grain.experimental, the transforms module), imported on first use."""
    from resume import grain_ops

    return grain_ops.gp, grain_ops.ge, grain_ops


class _Run:
    def __init__(self, scenario: str, iterator: Any, as_bytes: bool) -> None:
        self._scenario, self._it, self._bytes = scenario, iterator, as_bytes

    def __iter__(self):
        for batch in self._it:
            yield _ids(self._scenario, batch)

    def save(self) -> bytes:
        state = self._it.get_state()
        return state if self._bytes else json.dumps(state).encode()

    def close(self) -> None:
        close = getattr(self._it, "close", None)  # Grain's DataLoader iterator has none
        if close is not None:
            close()


def _paths(pattern: str) -> list[str]:
    return sorted(glob.glob(pattern))


class GrainLoader(Column):
    """``grain.python.DataLoader(data_source, IndexSampler, operations, worker_count=2)``."""

    name = "grain"
    packages = ("grain",)

    def unsupported(self, scenario: str) -> str | None:
        return ELASTIC_DOC if scenario == "elastic" else None

    def open(self, ctx: Any, state: Any) -> _Run:
        gp, ge, t = _grain()
        sc, sizes = ctx.scenario, ctx.sizes
        source: Any = gp.ArrayRecordDataSource(_paths(ctx.data["a"]))
        head = [t.Decode()]
        if sc == "mixture":
            # Grain's DataLoader reads any random-access source; a MapDataset mixture is one.
            a = gp.MapDataset.source(source).map(t.Decode())
            b = gp.MapDataset.source(gp.ArrayRecordDataSource(_paths(ctx.data["b"])))
            b = b.map(t.Decode()).map(t.ShiftB())
            source, head = gp.MapDataset.mix([a, b], weights=[0.3, 0.7]), []
        middle: list[Any] = [t.IdOnly(), gp.Batch(sizes.batch)]
        if sc == "filter":
            middle.insert(0, t.Keep())
        elif sc == "flat_map":
            middle.insert(0, t.FanOut())
        elif sc == "packing":
            middle = [t.TokensOnly(),
                      ge.PackAndBatchOperation(length_struct={"tokens": common.ROW}, batch_size=sizes.packed_batch)]
        sampler = gp.IndexSampler(
            num_records=len(source), shard_options=gp.ShardOptions(ctx.host, ctx.hosts),
            shuffle=True, num_epochs=ctx.epochs, seed=common.SEED,
        )
        loader = gp.DataLoader(data_source=source, sampler=sampler, operations=head + middle,
                               worker_count=ctx.workers)
        it = iter(loader)
        if state is not None:
            it.set_state(state)
        return _PackedIds(sc, it) if sc == "packing" else _Run(sc, it, True)


class _PackedIds(_Run):
    """PackAndBatchOperation yields ``(data, segmentations, positions)`` tuples."""

    def __init__(self, scenario: str, iterator: Any) -> None:
        super().__init__(scenario, iterator, True)

    def __iter__(self):
        for data, _segments, _positions in self._it:
            yield common.token_ids(data["tokens"])


class GrainDataset(Column):
    """``grain.MapDataset.source(...).seed(0).shuffle()...to_iter_dataset()...mp_prefetch(...)``."""

    name = "grain-dataset"
    packages = ("grain",)

    def open(self, ctx: Any, state: Any) -> _Run:
        gp, ge, t = _grain()
        sc, sizes = ctx.scenario, ctx.sizes
        ds = gp.MapDataset.source(gp.ArrayRecordDataSource(_paths(ctx.data["a"]))).map(t.Decode())
        if sc == "mixture":
            b = gp.MapDataset.source(gp.ArrayRecordDataSource(_paths(ctx.data["b"])))
            ds = gp.MapDataset.mix([ds, b.map(t.Decode()).map(t.ShiftB())], weights=[0.3, 0.7])
        ds = ds.seed(common.SEED).shuffle()
        if ctx.epochs > 1:
            ds = ds.repeat(ctx.epochs)
        options = gp.MultiprocessingOptions(num_workers=ctx.workers)
        if sc == "elastic":
            it = ge.ElasticIterator(ds.map(t.IdOnly()), common.elastic_batch(sizes, 1),
                                    gp.ShardOptions(ctx.host, ctx.hosts), multiprocessing_options=options)
            if state is not None:
                it.set_state(json.loads(state[0]))  # any old shard's state restores every shard
            return _Run(sc, _Closing(it), False)
        stream = ds.to_iter_dataset()
        if sc == "filter":
            stream = stream.filter(t.Keep())
        elif sc == "flat_map":
            stream = ge.FlatMapIterDataset(stream, t.FanOut())
        if sc == "packing":
            stream = stream.map(t.TokensOnly()).mp_prefetch(options)
            stream = ge.FirstFitPackIterDataset(stream, length_struct={"tokens": common.ROW},
                                                num_packing_bins=4, seed=common.SEED)
            stream = stream.batch(sizes.packed_batch)
        else:
            stream = stream.map(t.IdOnly()).batch(sizes.batch).mp_prefetch(options)
        it = iter(stream)
        if state is not None:
            it.set_state(json.loads(state))
        return _Run(sc, it, False)
