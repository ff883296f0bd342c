"""``ElasticIterator``: Grain's iterator whose state restores on another number of shards.

It batches and shards the dataset itself (each shard yields ``global_batch_size / H``
elements per step) and takes one of three paths, chosen by what the dataset is, once,
at construction (:func:`elastic_path`; ``ElasticIterator.path`` says which):

============== ================================================ ===================================
path           datasets                                         states
============== ================================================ ===================================
``index``      a ``MapDataset`` without filter or flat map; an  ``{"global_next_index": n}``, the
               ``IterDataset`` on the engine with maps only     same on every shard: any shard's
               (``MapDataset...to_iter_dataset().map(f)``, a    state restores every shard of any
               Parquet stream, interleaved and window-shuffled) count with ``set_state``
``shards``     an ``IterDataset`` on the engine with a filter,  each shard's own (a loader's); every
               a flat map, packers or window shuffles over it,  old shard's together restore on any
               ``map``/``filter`` after those                   count (``set_shard_states``)
``interleave`` an ``IterDataset`` over Grain's                  each dataset's own, keyed by its
               ``InterleaveIterDataset`` of other datasets      index: shard ``h`` of ``H`` reads
               (``map``/``filter`` over it)                     datasets ``h, h + H, ...``
============== ================================================ ===================================

* ``index`` (Grain's ``MapDataset`` path): shard ``h`` of ``H`` reads global positions
  ``g % H == h``, batched with the last short batch dropped, so global batch ``k`` is
  positions ``[k*G, (k+1)*G)`` whatever ``H`` is. From ``n``, shard ``h`` of any ``H'``
  goes on at ``n + h, n + h + H', ...`` (Grain's slices; an elastic layout when ``H'``
  does not divide ``n``), so the global batch size may change too. For an
  ``IterDataset`` (Grain's calls) ``get_shard_states`` is ``{shard_index: state}`` and
  ``set_shard_states`` takes their union; for a ``MapDataset`` they raise
  ``NotImplementedError``, as in Grain.
* ``shards``: a ``DataLoader`` with the stages, batched per shard, the last batch short
  (Grain's IterDataset path keeps it too). Its states differ by shard, so the restore
  needs them all: gather every shard's ``get_shard_states()`` (e.g. every process's file
  of the checkpoint) and hand their union to ``set_shard_states`` on each shard of the
  new count, which reads what the old shards left unread, each record exactly once
  (:mod:`dataloader.engine.restore`). ``get_state``/``set_state`` restore the same count.
* ``interleave`` (Grain's ``InterleaveIterDataset`` path, its shape and keys): the
  interleave reads this shard's datasets; ``get_shard_states`` keys each dataset's state
  (``{"exhausted": 0 or 1, "state": ...}``) by its index in the whole list, and
  ``set_shard_states`` takes every shard's (their union, or this shard's own) and goes
  on with each dataset where it was. Elements a stage over the interleave holds between
  steps are not in those states (as in Grain): a ``batch`` holds none, a ``flat_map``
  in the middle of an element's outputs would.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

from dataloader.dataset.arguments import check_size
from dataloader.dataset.base import DatasetIterator, IterDataset
from dataloader.dataset.elastic_path import (
    INDEX,
    INTERLEAVE,
    SHARDS,
    elastic_path,
    index_stream,
    interleave_under,
    own_shard_state,
    shards_loader,
)
from dataloader.dataset.map_dataset import MapDataset
from dataloader.engine.restore.protocol import StatePart
from dataloader.engine.stages.base import expect_state
from dataloader.errors import StateMismatchError
from dataloader.options import MultiprocessingOptions, ReadOptions
from dataloader.samplers import ShardOptions

_KEY = "global_next_index"
_PER_SHARD = ("shard_index", "shard_count", "batch_size")  # made_for fields a shard change may change


class ElasticIterator(DatasetIterator):
    """Batches and shards a dataset so that its state restores on any shard count.

    Args:
        ds: the unbatched, unsharded dataset (see the module docstring for what each
            kind of dataset gets).
        global_batch_size: rows of one step over all shards; each shard yields
            ``global_batch_size / shard_count`` rows per step. 0 on the ``interleave``
            path: no batching, as in Grain.
        shard_options: this shard (``ShardOptions`` or ``ShardByJaxProcess()``).
        read_options: read-ahead threads of the in-process path (default ``ReadOptions()``).
        multiprocessing_options: worker processes (the output does not depend on them);
            not on the ``interleave`` path, as in Grain.

    Raises:
        ValueError: a dataset it cannot make elastic (saying why), or a global batch size
            the shard count does not divide. TypeError: options of the wrong type.
        NotImplementedError: worker processes on the ``interleave`` path.

    Example:
        >>> import dataloader as dl
        >>> ds = dl.MapDataset.range(12).seed(3).shuffle()
        >>> it = dl.experimental.ElasticIterator(ds, 4, dl.ShardOptions(0, 2))
        >>> _ = next(it); it.get_state()["global_next_index"], it.path
        (4, 'index')
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
        if read_options is not None and not isinstance(read_options, ReadOptions):
            raise TypeError(f"ElasticIterator read_options must be a ReadOptions, got {read_options!r}")
        self._path = elastic_path(ds)
        self._map_dataset = isinstance(ds, MapDataset)
        unbatched = self._path.kind == INTERLEAVE and global_batch_size == 0
        self._global = 0 if unbatched else check_size(global_batch_size, "ElasticIterator global_batch_size")
        count = shard_options.shard_count
        if self._global % count:
            raise ValueError(
                f"global batch size {self._global} is not divisible by shard count {count}; "
                f"use a multiple of {count}"
            )
        self._shard_options = shard_options
        self._iterator: DatasetIterator | None = None
        self._loader: Any = None
        batch = self._global // count
        if self._path.kind == SHARDS:
            self._loader = shards_loader(self._path, shard_options, read_options, multiprocessing_options, batch)
        elif self._path.kind == INDEX:
            self._ds = index_stream(self._path.stream, shard_options, read_options or ReadOptions(), batch)
            if multiprocessing_options is not None:
                self._ds = self._ds.mp_prefetch(multiprocessing_options)
        else:
            if multiprocessing_options is not None:
                raise NotImplementedError(
                    "ElasticIterator does not support multiprocess prefetching for an IterDataset "
                    "over an InterleaveIterDataset (its shard states are those of the datasets "
                    "handed out, which a prefetching thread would read past), as in Grain; put "
                    "mp_prefetch on the datasets interleaved"
                )
            self._ds = copy.deepcopy(ds)
            interleave_under(self._ds).set_slice(slice(shard_options.shard_index, None, count))
            if batch:
                self._ds = self._ds.batch(batch, drop_remainder=False)

    @property
    def path(self) -> str:
        """``"index"``, ``"shards"`` or ``"interleave"``: the path its dataset takes."""
        return self._path.kind

    @property
    def shard_options(self) -> ShardOptions:
        return self._shard_options

    @property
    def _inner(self) -> DatasetIterator:
        if self._iterator is None:
            self._iterator = iter(self._loader) if self._loader is not None else iter(self._ds)
        return self._iterator

    def __next__(self) -> Any:
        return next(self._inner)

    def start_prefetch(self) -> None:
        """Starts the workers computing the first batches before the first ``next()``."""
        self._inner.start_prefetch()

    def get_state(self) -> dict[str, Any]:
        state = self._inner.get_state()
        if self._path.kind == INTERLEAVE:  # this shard's own, saying which (own_shard_state)
            return {"shard_index": self._shard_options.shard_index,
                    "shard_count": self._shard_options.shard_count, "iterator": state}
        if self._path.kind != INDEX:  # this shard's own state
            return state
        made_for = {k: v for k, v in state["made_for"].items() if k not in _PER_SHARD}
        start = state["elastic"]["frontier"] if "elastic" in state else 0  # set_state's (see there)
        return {_KEY: start + int(state["position"]) * self._shard_options.shard_count, "made_for": made_for}

    def set_state(self, state: dict[str, Any]) -> None:
        """Continues from a state: on the ``index`` path, of any shard saved with any shard
        count (a state with only ``global_next_index``, Grain's, is taken as made for this
        pipeline); on the others, of this shard on this shard count.

        Raises:
            StateMismatchError: the state is of another pipeline, or the shard count
                does not divide its ``global_next_index``.
        """
        if self._closed:  # set_state after close() goes on with a new stream, as in Grain
            self._closed, self._iterator = False, None
        if self._path.kind == SHARDS:
            if self._iterator is not None:
                self._iterator.close()
            self._iterator = self._loader.iterator(state)
            return
        if self._path.kind == INTERLEAVE:
            self._inner.set_state(own_shard_state(state, self._shard_options))
            return
        state = expect_state(state, (_KEY,), "ElasticIterator")
        n, count = int(state[_KEY]), self._shard_options.shard_count
        if n < 0:
            raise StateMismatchError(f"global_next_index={n} is invalid: expected an integer >= 0")
        inner = self._inner
        current = inner.get_state()
        made_for = {**current["made_for"], **state.get("made_for", {})}
        made_for.update({k: current["made_for"][k] for k in _PER_SHARD})
        restored = {"version": current["version"], "position": n // count, "sub_index": 0, "skip": 0,
                    "made_for": made_for}
        if n % count:
            # Shard h goes on at global positions n + h, n + h + count, ...: the plain
            # sharding reads those only when count divides n; an elastic layout whose
            # frontier is n reads them on any count (engine/restore/layout.py).
            restored.update(position=0, elastic={"frontier": n, "extra": [], "partial": []})
        inner.set_state(restored)

    def get_shard_states(self) -> dict[int, Any]:
        """This shard's states, keyed as Grain keys them (its shard index; on the
        ``interleave`` path, each of its datasets' index in the whole list). Gather every
        shard's dict (their union) for :meth:`set_shard_states`.

        Raises:
            NotImplementedError: for a ``MapDataset``, as in Grain (its ``get_state()``
                already restores every shard).
        """
        self._no_map_dataset("get_shard_states")
        if self._path.kind != INTERLEAVE:
            return {self._shard_options.shard_index: self.get_state()}
        h, count = self._shard_options.shard_index, self._shard_options.shard_count
        return {h + count * k: s for k, s in enumerate(self._interleave_iterator().get_shard_states())}

    def set_shard_states(self, shard_states: Any) -> None:
        """Continues from every old shard's states (a dict, the union of their
        :meth:`get_shard_states`, keys as ints or as JSON's strings; or a list), on this
        shard count: this shard reads its share of what the old shards left unread.

        Raises:
            NotImplementedError: for a ``MapDataset``, as in Grain.
            StateMismatchError: not one state per old shard of one step, states of
                another pipeline, or (``interleave``) not every dataset of this shard.
        """
        self._no_map_dataset("set_shard_states")
        if self._path.kind == SHARDS:
            states = list(shard_states.values()) if isinstance(shard_states, dict) else list(shard_states)
            self.set_state(states)  # type: ignore[arg-type]  # every old shard's: an elastic restore
        elif self._path.kind == INDEX:
            states = list(shard_states.values()) if isinstance(shard_states, dict) else list(shard_states)
            if len({s.get(_KEY) for s in states}) != 1:
                raise StateMismatchError(
                    f"the shards' states name different global_next_index values "
                    f"{sorted({s.get(_KEY) for s in states})}; pass the states of one step"
                )
            self.set_state(states[0])
        else:
            self._restore_interleave({int(k): v for k, v in dict(shard_states).items()})

    def _restore_interleave(self, states: dict[int, Any]) -> None:
        h, count = self._shard_options.shard_index, self._shard_options.shard_count
        if self._iterator is not None:
            self._iterator.close()
            self._iterator = None
        self._interleave_iterator().set_shard_states([s for k, s in sorted(states.items()) if k % count == h])

    def _interleave_iterator(self) -> Any:
        from dataloader.dataset.transformations.interleave import InterleaveDatasetIterator

        it: Any = self._inner
        while not isinstance(it, InterleaveDatasetIterator):
            it = it.parents[0]
        return it

    def _no_map_dataset(self, what: str) -> None:
        if self._map_dataset:
            raise NotImplementedError(
                f"{what} is only supported for IterDataset-based ElasticIterator (as in Grain); "
                f"this one reads a MapDataset, whose get_state() any shard count restores"
            )

    # The elastic-restore protocol (dataloader.engine.restore.protocol.ElasticStage): on
    # the shards path, set_state with every old shard's states restores the loader's
    # chain; the other paths restore from one state.

    @property
    def elastic_parent(self) -> Any:
        return self._inner if self._path.kind == SHARDS else None

    def last_tag(self) -> Any:
        return None  # batches

    def split_state(self, state: Any) -> StatePart:
        return StatePart(state)

    def restart_elastic(self, resume: Callable[[], None], kept: Sequence[Any]) -> None:
        resume()

    def close(self) -> None:
        if self._iterator is not None:
            self._iterator.close()
        super().close()

    def __repr__(self) -> str:
        inner = self._loader if self._loader is not None else self._ds
        return f"ElasticIterator({inner!r}, global_batch_size={self._global})"
