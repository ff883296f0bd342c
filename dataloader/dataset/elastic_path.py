"""Which path an ``ElasticIterator`` takes for a dataset, and what it builds for it.

The table and the three paths are :mod:`dataloader.dataset.experimental.elastic`'s;
:func:`elastic_path` is the one place that decides, by what the dataset is, once.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dataloader.dataset.base import IterDataset
from dataloader.dataset.map_dataset import MapDataset
from dataloader.options import MultiprocessingOptions, ReadOptions
from dataloader.samplers import ShardOptions

INDEX, SHARDS, INTERLEAVE = "index", "shards", "interleave"


@dataclasses.dataclass(frozen=True)
class Path:
    """The path an ``ElasticIterator`` takes for a dataset (see the module docstring).

    Attributes:
        kind: ``"index"``, ``"shards"`` or ``"interleave"``.
        stream: the engine-backed stream (``index``, ``shards``: a ``LoaderIterDataset``)
            or the dataset (``interleave``); a ``MapDataset`` for Grain's MapDataset path.
        stages: ``shards``: the stream operations and element-wise operations after the
            stream, for the loader (packers, window shuffles, maps, filters).
    """

    kind: str
    stream: Any
    stages: tuple[Any, ...] = ()


def elastic_path(ds: Any) -> Path:
    """The path for ``ds`` (the module docstring's table), or a ``ValueError`` saying why
    it has none."""
    from dataloader.dataset.iter_dataset import LoaderIterDataset
    from dataloader.dataset.streams.lowering import on_engine
    from dataloader.dataset.transformations.elementwise import ElementwiseIterDataset
    from dataloader.dataset.transformations.packing import PackIterDataset
    from dataloader.dataset.transformations.window_shuffle import WindowShuffleIterDataset

    if isinstance(ds, MapDataset):
        if ds.filtered:
            raise ValueError(
                f"ElasticIterator does not support `filter` transformation (nor a flat map) on a "
                f"MapDataset ({ds!r}): global batches would depend on the shard count; filter "
                f"after to_iter_dataset() (the shards path)"
            )
        _check_stream(ds.to_iter_dataset(), ds)
        return Path(INDEX, ds)
    if not isinstance(ds, IterDataset):
        raise TypeError(f"ElasticIterator takes a MapDataset or an IterDataset, got {ds!r}")
    interleave = interleave_under(ds)
    if interleave is not None and on_engine(interleave) is None:
        return Path(INTERLEAVE, ds)
    stages: list[Any] = []
    stream, bottom = ds, None
    while (engine := stream if type(stream) is LoaderIterDataset else on_engine(stream)) is None:
        if isinstance(stream, ElementwiseIterDataset):
            stages[:0] = stream.ops
        elif isinstance(stream, (PackIterDataset, WindowShuffleIterDataset)):
            stages.insert(0, stream.packer if isinstance(stream, PackIterDataset) else stream.stage_operation)
        else:
            raise ValueError(
                f"ElasticIterator has no elastic path for {stream!r}"
                f"{' under the packer or window shuffle' if stages else ''}: it takes a MapDataset, "
                f"a stream on the engine (MapDataset...to_iter_dataset(), a Parquet stream) with "
                f"map/filter/flat_map, packers and window shuffles over one, or an "
                f"InterleaveIterDataset of datasets; granary has no elastic path for other IterDatasets"
            )
        stream, bottom = stream.parents[0], stream
    if isinstance(bottom, ElementwiseIterDataset):
        raise ValueError(
            f"ElasticIterator takes map/filter calls over a stream on the engine only after a "
            f"packer or window shuffle, got {ds!r}; put them before to_iter_dataset()"
        )
    _check_stream(engine, ds)
    if stages or engine.shape.reshaped:
        return Path(SHARDS, engine, tuple(stages))
    return Path(INDEX, engine)


def _check_stream(stream: Any, ds: Any) -> None:
    shape = stream.shape
    if shape.batched:
        raise ValueError(f"ElasticIterator batches the dataset itself; pass it unbatched, got {ds!r}")
    if shape.sharded or shape.prefetched:
        raise ValueError(
            f"ElasticIterator shards and prefetches the stream itself; pass it unsharded "
            f"and without mp_prefetch, got {ds!r}"
        )


def interleave_under(ds: Any) -> Any:
    """The ``InterleaveIterDataset`` under ``ds`` and its element-wise calls, or None."""
    from dataloader.dataset.transformations.elementwise import ElementwiseIterDataset
    from dataloader.dataset.transformations.interleave import InterleaveIterDataset

    while isinstance(ds, ElementwiseIterDataset):
        ds = ds.parents[0]
    return ds if type(ds) is InterleaveIterDataset else None


def shards_loader(path: Path, shard_options: ShardOptions, read_options: ReadOptions | None,
                   mp: MultiprocessingOptions | None, batch: int) -> Any:
    """The loader of the ``shards`` path: the stream's engine, then its stages (packers,
    window shuffles and the maps and filters after them, which the loader runs after
    its packer, on its workers when it has some), batched per shard."""
    from dataloader.loader import DataLoader
    from dataloader.operations import Batch

    changes: dict[str, Any] = {"shard_options": shard_options}
    if read_options is not None:
        changes["read_options"] = read_options
    if mp is not None:
        changes["multiprocessing"] = mp
    base = path.stream.configured(**changes).loader
    plan = base.plan
    return DataLoader(
        plan.source, plan.sampler, [*(s.op for s in plan.pre), *path.stages, Batch(batch)],
        worker_count=base.worker_count, worker_buffer_size=base.worker_buffer_size,
        read_options=base.read_options, worker_init_fn=base.worker_init_fn, options=base.options,
    )


def index_stream(ds: Any, shard_options: ShardOptions, read_options: ReadOptions, batch: int) -> Any:
    """``ds`` (a ``MapDataset`` or a stream on the engine) sharded and batched as a
    ``DataLoader`` whose states restore elastically from any one shard's."""
    if isinstance(ds, MapDataset):
        stream = ds.to_iter_dataset(read_options, shard_options=shard_options)
    else:
        stream = ds.configured(shard_options=shard_options, read_options=read_options)
    return stream.batch(batch, drop_remainder=True)


def own_shard_state(state: Any, shard_options: ShardOptions) -> Any:
    """The iterator's state in an ``interleave`` path state, refused unless it is this
    shard's: it names only the datasets of the shard that saved it."""
    from dataloader.engine.stages.base import expect_state
    from dataloader.errors import StateMismatchError

    state = expect_state(state, ("shard_index", "shard_count", "iterator"), "ElasticIterator")
    saved = (state["shard_index"], state["shard_count"])
    if saved != (shard_options.shard_index, shard_options.shard_count):
        raise StateMismatchError(
            f"this state is shard {saved[0]} of {saved[1]}'s and this ElasticIterator is shard "
            f"{shard_options.shard_index} of {shard_options.shard_count}: over an "
            f"InterleaveIterDataset a state restores its own shard only; on another shard "
            f"count pass the union of every shard's get_shard_states() to set_shard_states"
        )
    return state["iterator"]
