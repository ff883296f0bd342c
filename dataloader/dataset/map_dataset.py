"""``MapDataset``: a lazy, random-access dataset built by chaining calls, as in Grain.

Every call returns a new dataset; nothing is read until an element is asked for. The
chain compiles (:mod:`dataloader.dataset.compile`) to a data source, a sampler and
operations, and runs on the loader's engine: ``ds[i]`` computes position ``i`` with the
same function a worker uses, and ``ds.to_iter_dataset()`` is a ``DataLoader``.

Seeds: ``.seed(s)`` sets the seed of the calls that follow. The first ``shuffle()``
after it uses ``s`` itself (so ``source(x).seed(s).shuffle()`` is
``IndexSampler(len(x), shuffle=True, seed=s)``, the very same order), later ones derive
their own from ``s``; ``random_map`` draws from ``record_rng(s, position, operation)``.
An explicit ``shuffle(seed=...)`` / ``random_map(..., seed=...)`` overrides it.
"""

from __future__ import annotations

import functools
import numbers
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np

from dataloader.dataset.arguments import (
    SHUFFLE_BITS,
    as_operation,
    check_seed,
    check_size,
    derive_seed,
    random_map_op,
)
from dataloader.dataset.compile import nodes as nd
from dataloader.dataset.compile.index_map import exhausted_length, mix_length
from dataloader.dataset.compile.lower import Compiled, compile_node
from dataloader.dataset.compile.mixing import MixSchedule, parse_mixture_spec
from dataloader.dataset.compile.schedule import WeightSchedule
from dataloader.operations import (
    Batch,
    FilterTransform,
    FlatMapTransform,
    MapTransform,
    MapWithIndexTransform,
    Operation,
    RandomMapTransform,
)
from dataloader.operations.padding import BatchAndPad
from dataloader.operations.transforms import KEEP
from dataloader.options import ReadOptions, check_bool
from dataloader.samplers import ShardOptions
from dataloader.samplers.index_sampler import choose_permutation

if TYPE_CHECKING:
    from dataloader.dataset.iter_dataset import LoaderIterDataset

T = TypeVar("T")


class MapDataset(Generic[T]):
    """A lazy dataset with random access, chained as in Grain; runs on the loader's engine.

    Build one with :meth:`source`, :meth:`range`, :meth:`mix`, :meth:`concatenate` or
    :meth:`mix_from_spec`, then chain calls. ``len(ds)`` is one pass (``sys.maxsize``
    after ``repeat()``), ``ds[i]`` the element at ``i`` (``None`` if a filter dropped
    it), ``ds[a:b:c]`` a slice, and ``to_iter_dataset()`` the checkpointable stream.

    Example:
        >>> import dataloader as dl
        >>> ds = dl.MapDataset.range(10).seed(1).shuffle().map(lambda x: x * 10).batch(4)
        >>> len(ds), ds[2].shape
        (3, (2,))
        >>> sorted(x for batch in ds for x in batch.tolist()) == list(range(0, 100, 10))
        True
    """

    def __init__(self, parents: MapDataset | Sequence[MapDataset] = ()) -> None:
        """For a dataset of your own (Grain's signature): subclass, call this with the
        parent dataset(s), and define ``__len__`` and ``__getitem__``."""
        if isinstance(parents, MapDataset):
            parents = (parents,)
        self._parents = tuple(parents)
        seeds = {p._seed for p in self._parents} - {None}
        self._seed: int | None = seeds.pop() if len(seeds) == 1 else None
        self._seed_uses: int = max((p._seed_uses for p in self._parents), default=0)
        self._filtered = False
        self._chain_node: Any = None

    @classmethod
    def _chain(
        cls, node: Any, *, seed: int | None = None, seed_uses: int = 0, filtered: bool = False,
        parents: tuple[MapDataset, ...] = (),
    ) -> MapDataset:
        """A dataset of the chained API: a node of the tree the engine compiles, and the
        datasets it was called on (Grain's ``parents``)."""
        ds = MapDataset.__new__(MapDataset)
        ds._parents = parents
        ds._chain_node = node
        ds._seed, ds._seed_uses, ds._filtered = seed, seed_uses, filtered
        return ds

    @property
    def filtered(self) -> bool:
        """Whether a filter or flat map in the chain drops or adds elements (so an
        element's index no longer is a fixed position of the source's)."""
        return self._filtered

    @property
    def parents(self) -> tuple[MapDataset, ...]:
        return self._parents

    @property
    def batched_by(self) -> Batch | None:
        """The :class:`~dataloader.operations.Batch` whose batches are this dataset's
        elements, when a batch is its last step (None otherwise)."""
        node = self._node
        return node.batch if isinstance(node, nd.BatchNode) else None

    @property
    def _parent(self) -> MapDataset:
        if len(self._parents) != 1:
            raise ValueError(f"{type(self).__name__} has {len(self._parents)} parents, not one")
        return self._parents[0]

    @property
    def _node(self) -> Any:
        """The tree node of this dataset; a dataset of your own is a leaf the engine reads
        through its ``__getitem__`` (its ``None`` elements are skipped when iterating)."""
        if self._chain_node is None:
            self._chain_node = nd.SourceNode(UserDatasetSource(self), len(self), user=True)
        return self._chain_node

    # The node ``.seed()`` was called on (None: no seed, or one inherited through several
    # parents): Grain's order derives a shuffle's seed from its distance to it.
    _seed_at: Any = None

    def _then(self, node: Any, **changes: Any) -> MapDataset:
        seed_at = changes.pop("seed_at", self._seed_at)
        fields: dict[str, Any] = {"seed": self._seed, "seed_uses": self._seed_uses, "filtered": self._filtered,
                                  "parents": (self,)}
        fields.update(changes)
        ds = MapDataset._chain(node, **fields)
        ds._seed_at = seed_at
        return ds

    def pipe(self, func: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """``func(self, *args, **kwargs)``: chain a transformation that is not a method."""
        return func(self, *args, **kwargs)

    def apply(self, transformations: Any) -> MapDataset:
        """Applies one operation or a list of them (map, random map, filter, flat map,
        map with index, batch), each through the matching call."""
        from dataloader.dataset.transformations.apply import apply_transformations

        return apply_transformations(self, transformations)

    # -- sources -------------------------------------------------------------------------

    @staticmethod
    def source(source: Any) -> MapDataset:
        """A dataset over a random-access source (``__len__`` and ``__getitem__``)."""
        if not (hasattr(source, "__len__") and hasattr(source, "__getitem__")):
            raise TypeError(
                f"MapDataset.source needs a random-access source with __len__ and "
                f"__getitem__ (e.g. ArrayRecordDataSource or a list), got {source!r}"
            )
        # An empty source is an empty dataset (length 0, iterating yields nothing), as in
        # Grain; ds[i] of it raises IndexError.
        return MapDataset._chain(nd.SourceNode(source, len(source)))

    @staticmethod
    def range(start: int, stop: int | None = None, step: int = 1) -> MapDataset:
        """The integers of ``range(start, stop, step)``."""
        from dataloader.sources import RangeDataSource

        return MapDataset.source(RangeDataSource(start, stop, step))

    @staticmethod
    def mix(
        datasets: Sequence[MapDataset], weights: Sequence[float] | WeightSchedule | None = None
    ) -> MapDataset:
        """Interleaves ``datasets`` in proportion to ``weights`` (see :mod:`.mixing`).

        Exact over every window of one period (10 positions for 0.3/0.7), deterministic,
        and a pure function of position, so the state stays one position. Each
        component keeps its own order and epochs. One pass is as long as Grain's:
        ``int(min(len_c / share_c))``, which may end a few positions before the first
        finite component runs out; ``repeat()`` the components for an endless mix.

        Raises:
            ValueError: no datasets, an empty dataset (it has no element to draw, as
                Grain checks), a weight that is negative or not finite, all weights
                zero, or a batched component that is infinite.
        """
        datasets = _check_datasets(datasets, "mix")
        empty = [f"{i} ({d!r})" for i, d in enumerate(datasets) if d._node.length == 0]
        if empty:
            raise ValueError(
                f"MapDataset.mix: {'datasets' if len(empty) > 1 else 'dataset'} {', '.join(empty)} "
                f"{'have' if len(empty) > 1 else 'has'} length 0; a mixture draws "
                f"from every dataset in turn, so each needs at least one element. Leave "
                f"the empty ones out of the mixture"
            )
        return MapDataset._mix(datasets, weights, until_exhausted=False)

    @staticmethod
    def _mix(
        datasets: Sequence[MapDataset], weights: Sequence[float] | WeightSchedule | None, *, until_exhausted: bool
    ) -> MapDataset:
        """:meth:`mix`, or with ``until_exhausted`` one pass that runs until a finite
        component with weight runs out (Grain's ``IterDataset.mix``, which the engine
        path of ``IterDataset.mix`` compiles to)."""
        datasets = _check_datasets(datasets, "mix")
        lengths = [d._node.length for d in datasets]
        schedule: Any
        if isinstance(weights, WeightSchedule):
            schedule = weights.bind(len(datasets), what="MapDataset.mix")
            length = schedule.exhausted_length(lengths)
        else:
            schedule = MixSchedule(weights, len(datasets))
            length = exhausted_length(lengths, schedule) if until_exhausted else mix_length(lengths, schedule)
        node = nd.MixNode(tuple(d._node for d in datasets), schedule, length)
        return _combine(node, datasets)

    @staticmethod
    def select_from_datasets(datasets: Sequence[MapDataset], selection_map: Any) -> MapDataset:
        """``result[i] = datasets[c][k]`` for ``(c, k) = selection_map[i]`` (see
        :mod:`dataloader.dataset.experimental.select`); ``len`` is the map's."""
        from dataloader.dataset.experimental.select import select_from_datasets

        return select_from_datasets(datasets, selection_map)

    @staticmethod
    def concatenate(datasets: Sequence[MapDataset]) -> MapDataset:
        """The datasets one after another (each finite)."""
        datasets = _check_datasets(datasets, "concatenate")
        for i, d in enumerate(datasets):
            if d._node.length is None:
                raise ValueError(
                    f"concatenate: dataset {i} ({d!r}) is infinite; concatenate finite "
                    f"datasets and repeat() the result"
                )
        node = nd.ConcatNode(tuple(d._node for d in datasets), sum(d._node.length for d in datasets))
        return _combine(node, datasets)

    @staticmethod
    def mix_from_spec(
        spec: str, *, seed: int | None = None, shuffle: bool = False, num_epochs: int | None = 1
    ) -> MapDataset:
        """A mixture of ArrayRecord files from a MaxText-style spec string.

        ``"a*.array_record:0.3;b*.array_record:0.7"``: each part is a path or glob and its
        weight (weights are normalised). Component ``c`` is
        ``MapDataset.source(ArrayRecordDataSource(pattern_c))``, shuffled with seed
        ``seed + c`` if ``shuffle``, repeated ``num_epochs`` times (``None``: for ever).
        The mixture carries ``seed`` for the calls that follow.
        """
        from dataloader.sources import ArrayRecordDataSource

        check_bool("mix_from_spec shuffle", shuffle)
        if shuffle and seed is None:
            raise ValueError("mix_from_spec(shuffle=True) needs a seed; pass seed=...")
        parts = parse_mixture_spec(spec)
        components = []
        for c, (pattern, _) in enumerate(parts):
            ds = MapDataset.source(ArrayRecordDataSource(pattern))
            if shuffle:
                ds = ds.shuffle(seed=check_seed(seed, "seed") + c)
            if num_epochs != 1:
                ds = ds.repeat(num_epochs)
            components.append(ds)
        mixed = MapDataset.mix(components, [w for _, w in parts])
        return mixed.seed(seed) if seed is not None else mixed

    # -- index-level calls -------------------------------------------------------------

    def seed(self, seed: int) -> MapDataset:
        """Sets the seed of the ``shuffle`` and ``random_map`` calls that follow."""
        return self._then(self._node, seed=check_seed(seed, "seed"), seed_uses=0, seed_at=self._node,
                          parents=self._parents)  # the same dataset, seeded: Grain's parents

    def shuffle(self, seed: int | None = None, *, permutation: str | None = None) -> MapDataset:
        """A global shuffle: a new stateless permutation in every epoch.

        Args:
            seed: the shuffle's seed; ``None`` takes one from ``.seed(...)`` earlier in
                the chain.
            permutation: the order. ``"granary"`` (our keyed Feistel network) or
                ``"grain"``: Grain 0.2's ``MapDataset.shuffle`` order, element for
                element, for a run moved from Grain (seeds below ``2**32``; a seed from
                ``.seed(s)`` is derived as Grain derives it, from ``s`` and the number of
                calls between). ``None`` (default) reads ``$GRANARY_PERMUTATION``
                (``granary`` when unset), which ``install_grain_alias(permutation=
                "grain")`` sets, so a Grain pipeline needs no edit. A state made under one
                order is refused by the other.

        Raises:
            ValueError: no seed (set one with ``.seed(...)`` or pass ``seed=``), the
                dataset is infinite (shuffle before ``repeat()``), or an unknown order.
        """
        length = self._finite("shuffle", "shuffle before repeat(): ds.shuffle().repeat()")
        permutation = choose_permutation(permutation)
        uses = self._seed_uses
        if seed is not None:
            if permutation == "grain":
                key = _grain_seed(seed)
            else:
                key = check_seed(seed, "shuffle seed", bits=SHUFFLE_BITS)
        elif self._seed is None:
            raise ValueError(
                "shuffle() needs a seed; call .seed(...) earlier in the chain, e.g. "
                "MapDataset.source(src).seed(42).shuffle(), or pass shuffle(seed=42)"
            )
        elif permutation == "grain":
            key = _grain_default_seed(self._seed, self._seed_depth())
        else:
            key = check_seed(self._seed, "seed", bits=SHUFFLE_BITS) if uses == 0 else derive_seed(self._seed, uses)
            uses += 1
        return self._then(nd.ShuffleNode(self._node, key, length, permutation), seed_uses=uses)

    def _seed_depth(self) -> int:
        """How many Grain datasets a shuffle here is from its ``.seed()`` one (Grain's
        depth: 1 for ``.seed(s).shuffle()``), counting one per chained call.

        Raises:
            ValueError: the seed came through a mix or concatenation, or a dataset of the
                user's own, whose depth Grain aggregates over every parent.
        """
        node, depth = self._node, 1
        while node is not self._seed_at:
            if self._seed_at is None or not hasattr(node, "parent"):
                raise ValueError(
                    "shuffle(permutation='grain') derives its seed from the .seed() call "
                    "above it in one chain; this one's seed came through a mix, concatenate "
                    "or a dataset of your own. Pass shuffle(seed=...) explicitly"
                )
            node, depth = node.parent, depth + 1
        return depth

    def repeat(self, num_epochs: int | None = None, *, reseed_each_epoch: bool = True) -> MapDataset:
        """``num_epochs`` passes (``None``: for ever, and ``len`` is ``sys.maxsize``).

        Each pass reshuffles the ``shuffle`` calls below it and draws new randomness for
        its ``random_map`` calls; with ``reseed_each_epoch=False`` every pass repeats the
        first exactly, as in Grain.

        An empty dataset stays empty (length 0), however often it is repeated.
        """
        length = self._finite("repeat", "it repeats already")
        if num_epochs is not None:
            num_epochs = check_size(num_epochs, "repeat(num_epochs)")
        check_bool("repeat(reseed_each_epoch)", reseed_each_epoch)
        total = None if num_epochs is None and length else length * (num_epochs or 1)
        return self._then(nd.RepeatNode(self._node, num_epochs, total, reseed_each_epoch))

    def slice(self, sl: slice | Sequence[int]) -> MapDataset:
        """The elements at ``range(len(ds))[sl]`` (also ``ds[start:stop:step]``), or, given
        a sequence of indices, the elements at those indices, in that order.

        ``ds.slice([3, 1, 4, 1, 5])`` is ``[ds[3], ds[1], ds[4], ds[1], ds[5]]`` (indices may
        repeat; a ``range`` or a ``MapDataset`` of integers works too), as Grain's. Past
        its length, the result reads on into the next epochs of ``ds`` (pass ``e`` is
        ``ds[indices[i] + e * len(ds)]``), as every index-level call does.

        ``ds[h::H]`` is Grain's way to shard; ``to_iter_dataset(shard_options=...)`` is
        ours (see docs/multi-host.md): the same elements, plus elastic restore.

        Raises:
            TypeError: ``sl`` is neither a slice nor a sequence of integers (a hole of a
                filtered ``MapDataset`` of indices is ``None``, not an integer).
            ValueError: a negative index, or an infinite ``MapDataset`` of indices.
        """
        if not isinstance(sl, slice):
            self._finite_if_batched("slice")
            indices = _index_sequence(sl)
            return self._then(nd.ReindexNode(self._node, indices, len(indices)))
        n = self._node.length
        length: int | None
        if n is not None:
            start, stop, step = sl.indices(n)
            length = len(range(start, stop, step))
        else:
            start, stop, step = sl.start or 0, sl.stop, 1 if sl.step is None else sl.step
            if start < 0 or step < 1 or (stop is not None and stop < 0):
                raise ValueError(
                    f"slice {sl} of an infinite dataset needs start, stop >= 0 and step >= 1; "
                    f"slice before repeat() for negative indices"
                )
            length = None if stop is None else len(range(start, stop, step))
            self._finite_if_batched("slice")
        return self._then(nd.SliceNode(self._node, start, stop, step, length))

    # -- element-level calls -------------------------------------------------------------

    def map(self, transform: MapTransform | Callable[[Any], Any]) -> MapDataset:
        """Applies ``transform`` (a function or a ``MapTransform``) to every element."""
        return self._apply(as_operation(transform, MapTransform, "map"))

    def random_map(
        self, transform: RandomMapTransform | Callable[..., Any], *, seed: int | None = None
    ) -> MapDataset:
        """Applies ``transform(element, rng)``; ``rng`` depends on (seed, position, operation)."""
        return self._apply(random_map_op(transform, seed, self._seed))

    def filter(self, transform: FilterTransform | Callable[[Any], bool]) -> MapDataset:
        """Keeps elements where ``transform`` is true; ``ds[i]`` is ``None`` for the others."""
        return self._apply(as_operation(transform, FilterTransform, "filter"))

    def flat_map(self, transform: FlatMapTransform | Callable[[Any], Any]) -> MapDataset:
        """Replaces every element by the elements ``transform`` returns, in Grain's layout.

        ``transform`` is a ``FlatMapTransform`` with ``max_fan_out = F`` (or a function,
        with ``max_fan_out`` set on a ``FlatMapTransform`` around it): the result has
        ``F`` slots per element, ``ds[k]`` is output ``k % F`` of element ``k // F`` or
        ``None`` where there is no such output, and iteration yields the outputs in
        order. Batch on the iterable stream (``to_iter_dataset()``), as after a filter.

        On an endless dataset (after ``repeat()``) the result is endless too; index ``k``
        past one pass reads element ``k // F`` of the parent's later epochs, as in Grain.

        Raises:
            ValueError: no ``max_fan_out``.
        """
        op = as_operation(transform, FlatMapTransform, "flat_map")
        if op.max_fan_out is None:
            raise ValueError(
                f"MapDataset.flat_map({op.name}) needs max_fan_out: random access lays out "
                f"max_fan_out slots per element; pass FlatMapTransform(fn, max_fan_out=...)"
            )
        length = self._node.length
        node = nd.FlatMapNode(self._node, op, None if length is None else length * op.max_fan_out)
        return self._then(node, filtered=True)

    def map_with_index(self, transform: MapWithIndexTransform | Callable[[int, Any], Any]) -> MapDataset:
        """Applies ``transform(index, element)``, ``index`` the element's index in this
        dataset (Grain's ``map_with_index``). Index-level calls after it (shuffle, slice)
        move the elements with the index they had here.

        As in Grain, the index is the one this dataset is read at, whole: after
        ``repeat()`` it counts on through the epochs (``range(3).repeat()
        .map_with_index(f)`` gives ``f(4, 1)`` at index 4), and a read past one pass
        (``ds[len(ds) + 1]``, a later epoch of a ``repeat`` or ``shuffle`` above it) gets
        that index, not its remainder.

        Raises:
            ValueError: the dataset is batched (map the elements before the batch).
        """
        from dataloader.dataset.transformations.elementwise import with_index

        op = with_index(transform)
        if nd.is_batched(self._node):
            raise ValueError(
                f"map_with_index after a batch is not available on a MapDataset ({self!r}); "
                f"map the elements before the batch"
            )
        return self._then(nd.WithIndexNode(self._node, op, self._node.length))

    def _apply(self, op: Operation) -> MapDataset:
        """``op`` (a map, random map or filter) applied to every element."""
        filtered = self._filtered or op.returns == KEEP
        return self._then(nd.OpNode(self._node, op, self._node.length), filtered=filtered)

    def batch(
        self,
        batch_size: int,
        *,
        drop_remainder: bool = False,
        batch_fn: Callable[[list[Any]], Any] | None = None,
    ) -> MapDataset:
        """Groups consecutive elements into batches (``ds[i]`` is batch ``i``).

        Raises:
            ValueError: a filter comes earlier in the chain (its holes would make
                batches ragged): batch on the iterable stream instead,
                ``ds.to_iter_dataset().batch(...)``.
        """
        return self._batch(Batch(batch_size, drop_remainder=drop_remainder, batch_fn=batch_fn))

    def batch_and_pad(self, batch_size: int, *, pad_value: Any = 0, mask_key: str = "mask") -> MapDataset:
        """Batches, padding the last short batch to ``batch_size`` rows with a mask (see
        :func:`operations.padding.batch_and_pad`)."""
        return self._batch(BatchAndPad(batch_size, pad_value=pad_value, mask_key=mask_key))

    def _batch(self, op: Batch) -> MapDataset:
        if self._filtered:
            raise ValueError(
                f"{op.name} after a filter or a flat map is not available on a MapDataset: "
                f"filtered elements and a flat map's empty slots leave holes, so batches would "
                f"not be of consecutive elements. "
                f"Batch the iterable stream instead: ds.to_iter_dataset().batch(...)"
            )
        n = self._node.length
        if n is None:
            length = None
        else:
            length = op.batches_in(n)
        return self._then(nd.BatchNode(self._node, op, length))

    # -- access ----------------------------------------------------------------------------

    @functools.cached_property
    def _compiled(self) -> Compiled:
        return compile_node(self._node, self._seed)

    def __len__(self) -> int:
        return sys.maxsize if self._node.length is None else self._node.length

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self.slice(index)
        if isinstance(index, bool) or not isinstance(index, numbers.Integral):
            raise TypeError(
                f"dataset indices must be integers or slices, got {index!r}; for the elements "
                f"at a list of indices use ds.slice([...])"
            )
        index = int(index)
        if self._node.length == 0:
            raise IndexError(f"index {index} of an empty dataset ({self!r}); it has no element")
        if index < 0:
            raise IndexError(
                f"index {index} is negative; dataset indices count from 0 (past len(ds) they "
                f"read on into the next epoch, as in Grain)"
            )
        return self._compiled.item(index)

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        indices = list(indices)
        if len(indices) < 2 or self._node.length == 0 or any(
            isinstance(i, bool) or not isinstance(i, numbers.Integral) or i < 0 for i in indices
        ):
            return [self[i] for i in indices]  # one at a time: its checks name what is wrong
        return self._compiled.items(indices)

    def _getitems(self, indices: Sequence[int]) -> list[Any]:
        """Grain's batched read: ``[ds[i] for i in indices]`` (``None`` where a filter
        dropped one), computing runs of consecutive indices together. A dataset of your
        own may override it, as in Grain, to read its records in one call."""
        if isinstance(self._node, nd.SourceNode) and self._node.user:
            # Grain's default for a dataset of your own; an override calling it must not
            # come back here through the engine's reads of this dataset.
            return [self[int(i)] for i in indices]
        return self.__getitems__(indices)

    def __iter__(self) -> Any:
        return iter(self.to_iter_dataset())

    def to_iter_dataset(
        self,
        read_options: ReadOptions | None = None,
        *,
        allow_nones: bool = False,
        shard_options: ShardOptions | None = None,
    ) -> LoaderIterDataset:
        """The checkpointable stream of this dataset's elements (filtered ones skipped).

        Args:
            read_options: read-ahead threads of the in-process path (``ReadOptions``).
            allow_nones: yield the ``None`` elements of the dataset (a dataset of your own
                returning ``None``, the empty slots of ``flat_map``) instead of skipping
                them, as Grain does. Elements a ``filter`` drops are dropped either way:
                filters run on the stream here, not as holes.
            shard_options: this host's shard of the stream, interleaved after the
                global order (``ShardOptions`` or ``ShardByJaxProcess()``). A ``batch``
                in the chain is then the per-host batch, as in ``DataLoader``.
        """
        from dataloader.dataset.iter_dataset import LoaderIterDataset

        return LoaderIterDataset(
            self, read_options=read_options, shard_options=shard_options, allow_nones=allow_nones
        )

    def __repr__(self) -> str:
        return repr(self._node)

    # -- checks ----------------------------------------------------------------------------

    def _finite(self, what: str, hint: str) -> int:
        if self._node.length is None:
            raise ValueError(f"cannot {what} an infinite dataset ({self!r}); {hint}")
        return self._node.length

    def _finite_if_batched(self, what: str) -> None:
        if self._node.length is None and nd.is_batched(self._node):
            raise ValueError(
                f"cannot {what} {self!r}: it is batched and infinite; {what} before the "
                f"batch, or repeat after it"
            )


def _index_sequence(indices: Any) -> Any:
    """``indices`` of ``slice(indices)`` checked: a ``range`` as it is, anything else as an
    int64 array (a ``MapDataset`` of integers is read once, here)."""
    what = "slice() takes a slice or a sequence of non-negative integer indices"
    if isinstance(indices, range):
        if len(indices) and min(indices[0], indices[-1]) < 0:
            raise ValueError(f"{what}; {indices!r} has negative indices")
        return indices
    if isinstance(indices, MapDataset):
        if indices._node.length is None:
            raise ValueError(f"{what}; the MapDataset of indices {indices!r} is infinite")
        values = indices.__getitems__(list(range(len(indices)))) if len(indices) else []
    elif isinstance(indices, (str, bytes)) or not isinstance(indices, (Sequence, np.ndarray)):
        raise TypeError(f"{what}, got {indices!r}")
    else:
        values = list(indices)
    for i, v in enumerate(values):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral):
            raise TypeError(f"{what}; index {i} is {v!r}")
        if v < 0:
            raise ValueError(
                f"{what}; index {i} is {v} (count from 0; negative indices are not read "
                f"from the end here)"
            )
    return np.asarray(values, dtype=np.int64).reshape(-1)


def _check_datasets(datasets: Any, what: str) -> list[MapDataset]:
    datasets = list(datasets)
    if not datasets:
        raise ValueError(f"{what} needs at least one dataset")
    for i, d in enumerate(datasets):
        if not isinstance(d, MapDataset):
            raise TypeError(
                f"{what}: datasets[{i}] is {d!r}, expected a MapDataset (use "
                f"IterDataset.mix for IterDatasets)"
            )
        d._finite_if_batched(what)
    return datasets


def _grain_seed(seed: Any) -> int:
    """A seed of Grain's shuffle: an integer in ``[0, 2**32)``, as Grain checks it."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**32:
        raise ValueError(
            f"shuffle(permutation='grain') takes seeds in [0, 2**32), as Grain's shuffle does, "
            f"got {seed!r}"
        )
    return int(seed)


def _grain_default_seed(seed: int, depth: int) -> int:
    """The seed Grain gives a shuffle ``depth`` datasets below ``.seed(seed)``."""
    return int(np.random.SeedSequence([seed, depth]).generate_state(1, dtype=np.uint32)[0])


def _combined_fields(datasets: list[MapDataset]) -> tuple[int | None, int, bool]:
    """(seed, seed uses, filtered) of a dataset over several: their seed when they all
    share one; else, when any of them has a seed, one derived from the seeds and their
    places (Grain aggregates every seeded parent's seed: a mixture of which one
    component is seeded still seeds the random maps after it); and holes if any has."""
    seeds = {d._seed for d in datasets}
    if len(seeds) == 1:
        seed = seeds.pop()
        return seed, max(d._seed_uses for d in datasets) if seed is not None else 0, any(d.filtered for d in datasets)
    placed = [v for i, d in enumerate(datasets) if d._seed is not None for v in (d._seed, i)]
    seed = derive_seed(int(np.random.SeedSequence(placed).generate_state(1, np.uint64)[0]), 1) if placed else None
    return seed, 0, any(d.filtered for d in datasets)


def _combine(node: Any, datasets: list[MapDataset]) -> MapDataset:
    """A dataset over several (see :func:`_combined_fields`)."""
    seed, uses, filtered = _combined_fields(datasets)
    return MapDataset._chain(node, seed=seed, seed_uses=uses, filtered=filtered, parents=tuple(datasets))


class UserDatasetSource:
    """A ``MapDataset`` of the user's own as a random-access source of the engine."""

    def __init__(self, dataset: MapDataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[int(index)]

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        if type(self.dataset)._getitems is not MapDataset._getitems:  # Grain's batched read hook
            return list(self.dataset._getitems([int(i) for i in indices]))
        return [self.dataset[int(i)] for i in indices]

    def __repr__(self) -> str:
        return f"{type(self.dataset).__name__}(len={len(self.dataset)})"
