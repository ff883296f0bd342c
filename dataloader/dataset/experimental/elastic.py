"""``ElasticIterator``: Grain's iterator whose state restores on another number of shards.

Built on the loader's own elastic restore (README "Elastic restore",
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
depend on the shard count). Grain's ``IterDataset`` path (interleaved sources, its
``get_shard_states``) is not provided: other ``IterDataset`` s are refused.
``global_batch_size`` may change across a restore as long as ``H'`` divides ``n``
(always so when it stays the same).
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
        self._ds = _elastic_stream(ds, shard_options, read_options or ReadOptions(), self._global // count)
        if multiprocessing_options is not None:
            self._ds = self._ds.mp_prefetch(multiprocessing_options)
        self._iterator: DatasetIterator | None = None

    @property
    def shard_options(self) -> ShardOptions:
        return self._shard_options

    @property
    def _inner(self) -> DatasetIterator:
        if self._iterator is None:
            self._iterator = iter(self._ds)
        return self._iterator

    def __next__(self) -> Any:
        return next(self._inner)

    def start_prefetch(self) -> None:
        """Starts the workers computing the first batches before the first ``next()``."""
        self._inner.start_prefetch()

    def get_state(self) -> dict[str, Any]:
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

    def get_shard_states(self) -> Any:
        raise NotImplementedError(
            "get_shard_states is Grain's API for IterDataset-based ElasticIterators, which "
            "granary does not provide; use get_state(), which any shard count restores"
        )

    def set_shard_states(self, shard_states: Any) -> None:
        raise NotImplementedError(
            "set_shard_states is Grain's API for IterDataset-based ElasticIterators, which "
            "granary does not provide; use set_state()"
        )

    def close(self) -> None:
        if self._iterator is not None:
            self._iterator.close()
        super().close()

    def __repr__(self) -> str:
        return f"ElasticIterator({self._ds!r}, global_batch_size={self._global})"


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
