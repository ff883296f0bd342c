"""``ElasticIterator``: Grain's iterator whose state restores on another number of shards.

Built on the loader's own elastic restore (docs/elastic-restore.md,
:func:`dataloader.engine.state.resolve_state`): the dataset is read with interleaved
sharding (shard ``h`` of ``H`` reads global positions ``g % H == h``, after the
global shuffle) and batched ``global_batch_size / H`` rows per shard, so global batch
``k`` is global positions ``[k*G, (k+1)*G)`` whatever ``H`` is. The state is Grain's,
``{"global_next_index": n}`` (plus what the pipeline was made for, so a state of
another dataset is refused): the same on every shard after the same number of steps,
so the state of any shard restores every shard of any shard count ``H'`` (shard ``h``
continues at its local position ``n / H'``).

What it accepts: a ``MapDataset``, or a ``MapDataset...to_iter_dataset()`` with maps and
random maps chained on it, unbatched, unsharded and without a filter or flat map (the
batch and the sharding are the iterator's, and a filter would make global batches
depend on the shard count). ``global_batch_size`` may change across a restore as long
as ``H'`` divides ``n`` (always so when it stays the same).

The ``IterDataset`` path, Grain's ``get_shard_states``/``set_shard_states``: a stream on
the engine with filters or flat maps (``ds.to_iter_dataset().filter(...)``, a Parquet
stream's ``map``/``filter``/...), or a first-fit, best-fit or concat-then-split packer
or a ``WindowShuffleIterDataset`` over one (or over each other, with ``map``/``filter``
calls after them, which run on the workers given), unbatched and unsharded. Each shard
yields ``global_batch_size / H`` elements
(or rows) per step, the last batch short (Grain's IterDataset path keeps it too). Its
states differ by shard, so the restore needs them all: ``get_shard_states()`` is this
shard's ``{shard_index: state}``; gather every shard's (e.g. every process's file of the
checkpoint) and hand their union to ``set_shard_states`` on each shard of the new shard
count, which reads what the old shards left unread, each record exactly once
(:func:`dataloader.elastic_iterator`, docs/elastic-restore.md). ``get_state`` and
``set_state`` restore on the same shard count. Grain keys its shard states by the files
of an interleave instead; such states are not read.
"""

from __future__ import annotations

from typing import Any

from dataloader.dataset.arguments import check_size
from dataloader.dataset.base import DatasetIterator, IterDataset
from dataloader.dataset.map_dataset import MapDataset
from dataloader.engine.stages.base import expect_state
from dataloader.errors import StateMismatchError
from dataloader.options import MultiprocessingOptions, ReadOptions
from dataloader.samplers import ShardOptions

_KEY = "global_next_index"
_PER_SHARD = ("shard_index", "shard_count", "batch_size")  # made_for fields a shard change may change


class ElasticIterator(DatasetIterator):
    """Batches and shards a dataset so that its state restores on any shard count.

    Args:
        ds: the unbatched, unsharded dataset (see the module docstring).
        global_batch_size: rows of one step over all shards; each shard yields
            ``global_batch_size / shard_count`` rows per step (the last short batch
            is dropped).
        shard_options: this shard (``ShardOptions`` or ``ShardByJaxProcess()``).
        read_options: read-ahead threads of the in-process path (default ``ReadOptions()``).
        multiprocessing_options: worker processes (the output does not depend on them).

    Raises:
        ValueError: a dataset it cannot make elastic, or a global batch size that the
            shard count does not divide.
        TypeError: options of the wrong type.

    Example:
        >>> import dataloader as dl
        >>> ds = dl.MapDataset.range(12).seed(3).shuffle()
        >>> it = dl.experimental.ElasticIterator(ds, 4, dl.ShardOptions(0, 2))
        >>> _ = next(it); it.get_state()["global_next_index"]
        4
    """

    def __init__(
        self,
        ds: MapDataset | IterDataset,
        global_batch_size: int,
        shard_options: ShardOptions,
        *,
        read_options: ReadOptions | None = None,
        multiprocessing_options: MultiprocessingOptions | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(shard_options, ShardOptions):
            raise TypeError(f"ElasticIterator shard_options must be a ShardOptions, got {shard_options!r}")
        if multiprocessing_options is not None and not isinstance(multiprocessing_options, MultiprocessingOptions):
            raise TypeError(
                f"ElasticIterator multiprocessing_options must be MultiprocessingOptions, got "
                f"{multiprocessing_options!r}"
            )
        self._global = check_size(global_batch_size, "ElasticIterator global_batch_size")
        count = shard_options.shard_count
        if self._global % count:
            raise ValueError(
                f"global batch size {self._global} is not divisible by shard count {count}; "
                f"use a multiple of {count}"
            )
        self._shard_options = shard_options
        if read_options is not None and not isinstance(read_options, ReadOptions):
            raise TypeError(f"ElasticIterator read_options must be a ReadOptions, got {read_options!r}")
        self._iterator: DatasetIterator | None = None
        # The IterDataset path: a loader whose states restore from every shard's.
        self._loader = _shard_state_loader(ds, shard_options, read_options, multiprocessing_options,
                                           self._global // count)
        if self._loader is not None:
            return
        self._ds = _elastic_stream(ds, shard_options, read_options or ReadOptions(), self._global // count)
        if multiprocessing_options is not None:
            self._ds = self._ds.mp_prefetch(multiprocessing_options)

    @property
    def shard_options(self) -> ShardOptions:
        return self._shard_options

    @property
    def restores_from_every_shard(self) -> bool:
        """On the IterDataset path, an Orbax restore on another process count hands
        :meth:`set_state` every old process's state (``dataloader.checkpoint``)."""
        return self._loader is not None

    @property
    def _inner(self) -> DatasetIterator:
        if self._iterator is None:
            self._iterator = iter(self._loader) if self._loader is not None else iter(self._ds)
        return self._iterator

    def _restart(self, states: Any) -> None:
        from dataloader.engine.elastic import head_state
        from dataloader.iterator import elastic_iterator

        assert self._loader is not None
        if self._iterator is not None:
            self._iterator.close()
        if isinstance(states, dict) and head_state(states)[0].get("elastic") is None:
            self._iterator = self._loader.iterator(states)
        else:
            self._iterator = elastic_iterator(self._loader, states)

    def __next__(self) -> Any:
        return next(self._inner)

    def start_prefetch(self) -> None:
        """Starts the workers computing the first batches before the first ``next()``."""
        self._inner.start_prefetch()

    def get_state(self) -> dict[str, Any]:
        if self._loader is not None:  # the IterDataset path: this shard's own state
            return self._inner.get_state()
        state = self._inner.get_state()
        made_for = {k: v for k, v in state["made_for"].items() if k not in _PER_SHARD}
        return {_KEY: int(state["position"]) * self._shard_options.shard_count, "made_for": made_for}

    def set_state(self, state: dict[str, Any]) -> None:
        """Continues from a state of any shard, saved with any shard count.

        A state with only ``global_next_index`` (Grain's) is taken as made for this
        pipeline.

        Raises:
            StateMismatchError: the state is of another pipeline, or the shard count
                does not divide its ``global_next_index``.
        """
        if self._loader is not None:  # this shard's state, or every old shard's (a list)
            self._restart(state)
            return
        state = expect_state(state, (_KEY,), "ElasticIterator")
        n, count = int(state[_KEY]), self._shard_options.shard_count
        if n < 0 or n % count:
            raise StateMismatchError(
                f"global_next_index={n} cannot be split over {count} shards (each shard "
                f"continues at global_next_index / shard_count); restore on a shard count "
                f"that divides {n}"
            )
        inner = self._inner
        current = inner.get_state()
        made_for = {**current["made_for"], **state.get("made_for", {})}
        made_for.update({k: current["made_for"][k] for k in _PER_SHARD})
        inner.set_state({**current, "position": n // count, "sub_index": 0, "skip": 0, "made_for": made_for})

    def get_shard_states(self) -> dict[int, Any]:
        """This shard's state, keyed by its shard index (the IterDataset path).

        Gather every shard's dict (their union) for :meth:`set_shard_states`.

        Raises:
            NotImplementedError: on the ``MapDataset`` path, as in Grain (its
                ``get_state()`` already restores every shard).
        """
        if self._loader is None:
            raise NotImplementedError(
                "get_shard_states is for IterDataset-based ElasticIterators (as in Grain); "
                "this one reads a MapDataset, whose get_state() any shard count restores"
            )
        return {self._shard_options.shard_index: self._inner.get_state()}

    def set_shard_states(self, shard_states: Any) -> None:
        """Continues from every old shard's state (a dict ``{shard_index: state}``, the
        union of their :meth:`get_shard_states`, or a list), on this shard count: this
        shard reads its share of what the old shards left unread.

        Raises:
            NotImplementedError: on the ``MapDataset`` path, as in Grain.
            StateMismatchError: not one state per old shard of one step, or states of
                another pipeline.
        """
        if self._loader is None:
            raise NotImplementedError(
                "set_shard_states is for IterDataset-based ElasticIterators (as in Grain); "
                "this one reads a MapDataset: use set_state()"
            )
        states = list(shard_states.values()) if isinstance(shard_states, dict) else list(shard_states)
        self._restart(states)

    def close(self) -> None:
        if self._iterator is not None:
            self._iterator.close()
        super().close()

    def __repr__(self) -> str:
        inner = self._loader if self._loader is not None else self._ds
        return f"ElasticIterator({inner!r}, global_batch_size={self._global})"


def _shard_state_loader(ds: Any, shard_options: ShardOptions, read_options: ReadOptions | None,
                        mp: MultiprocessingOptions | None, batch: int) -> Any:
    """The loader of the IterDataset path (see the module docstring), or None when ``ds``
    takes the ``MapDataset`` path."""
    from dataloader.dataset.iter_dataset import LoaderIterDataset
    from dataloader.dataset.transformations.elementwise import ElementwiseIterDataset
    from dataloader.dataset.transformations.packing import PackIterDataset
    from dataloader.dataset.transformations.window_shuffle import WindowShuffleIterDataset
    from dataloader.loader import DataLoader
    from dataloader.operations import Batch

    # Stages over the stream: packers, window shuffles and the maps and filters after
    # them (the loader runs those after its packer, on its workers when it has some).
    packers: list[Any] = []
    stream, bottom = ds, None
    while isinstance(stream, (PackIterDataset, WindowShuffleIterDataset, ElementwiseIterDataset)):
        if isinstance(stream, ElementwiseIterDataset):
            packers[:0] = stream.ops
        else:
            packers.insert(0, stream.packer if isinstance(stream, PackIterDataset) else stream.stage_operation)
        stream, bottom = stream._parent, stream
    if isinstance(bottom, ElementwiseIterDataset):
        raise ValueError(
            f"ElasticIterator takes map/filter calls over a stream on the engine only after a "
            f"packer or window shuffle, got {ds!r}; put them before to_iter_dataset()"
        )
    if type(stream) is not LoaderIterDataset or not (packers or stream._reshaped() or stream._parent._filtered):
        if packers:
            raise ValueError(
                f"ElasticIterator packs or window-shuffles a stream on the engine "
                f"(MapDataset...to_iter_dataset() and its map/filter/flat_map), got {stream!r} "
                f"under the packer or window shuffle"
            )
        return None
    if stream._is_batched():
        raise ValueError(f"ElasticIterator batches the stream itself; pass it unbatched, got {stream!r}")
    if stream._shard_options is not None or stream._mp is not None:
        raise ValueError(
            f"ElasticIterator shards and prefetches the stream itself; pass it unsharded "
            f"and without mp_prefetch, got {stream!r}"
        )
    changes: dict[str, Any] = {"shard_options": shard_options}
    if read_options is not None:
        changes["read_options"] = read_options
    if mp is not None:
        changes["multiprocessing"] = mp
    base = stream._with(**changes).loader
    plan = base.plan
    return DataLoader(
        plan.source, plan.sampler, [*(s.op for s in plan.pre), *packers, Batch(batch)],
        worker_count=base.worker_count, worker_buffer_size=base.worker_buffer_size,
        read_options=base.read_options, worker_init_fn=base.worker_init_fn, options=base.options,
    )


def _elastic_stream(ds: Any, shard_options: ShardOptions, read_options: ReadOptions, batch: int) -> Any:
    """``ds`` sharded and batched as a ``DataLoader`` whose states restore elastically."""
    from dataloader.dataset.compile.nodes import is_batched
    from dataloader.dataset.iter_dataset import LoaderIterDataset

    if isinstance(ds, MapDataset):
        if ds._filtered:
            raise ValueError(
                f"ElasticIterator does not support a filter or flat map ({ds!r}): global "
                f"batches would depend on the shard count"
            )
        if is_batched(ds._node):
            raise ValueError(f"ElasticIterator batches the dataset itself; pass it unbatched, got {ds!r}")
        stream = ds.to_iter_dataset(read_options, shard_options=shard_options)
    elif type(ds) is LoaderIterDataset:
        if ds._is_batched() or ds._reshaped() or ds._parent._filtered:
            raise ValueError(
                f"ElasticIterator needs an unbatched stream without filter or flat map, got {ds!r}"
            )
        if ds._shard_options is not None or ds._mp is not None:
            raise ValueError(
                f"ElasticIterator shards and prefetches the stream itself; pass it unsharded "
                f"and without mp_prefetch, got {ds!r}"
            )
        stream = ds._with(shard_options=shard_options, read_options=read_options)
    else:
        raise ValueError(
            f"ElasticIterator takes a MapDataset or its to_iter_dataset() with maps, got "
            f"{ds!r}; granary has no elastic path for other IterDatasets"
        )
    return stream.batch(batch, drop_remainder=True)
