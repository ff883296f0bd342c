"""The engine-backed ``IterDataset``: the checkpointable stream of a ``MapDataset``.

``MapDataset.to_iter_dataset()`` makes a :class:`LoaderIterDataset`, a ``DataLoader``
under construction: its ``MapDataset`` compiles to a source, a sampler and operations,
the element-wise calls chained on it (``map``, ``random_map``, ``filter``, ``flat_map``,
one ``batch``) append operations, ``prefetch``/``mp_prefetch`` set how it runs, and
``iter(ds)`` is the loader's own iterator. So it has the loader's guarantees:
``get_state()`` describes the last element handed out, ``set_state()`` resumes in O(1)
with any worker count, a state made for another pipeline is refused, and the output
does not depend on ``num_workers``.

Operations appended after ``mp_prefetch`` run in the workers too; being pure functions
of their input (and of their generator), they give the same output wherever they run.
Calls the engine cannot run (a second ``batch``, a ``map_with_index`` after a filter)
continue at the iterator level (:mod:`dataloader.dataset.transformations.elementwise`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from dataloader.dataset.arguments import check_seed, random_map_op
from dataloader.dataset.base import IterDataset
from dataloader.dataset.compile.nodes import has_user_dataset, is_batched, reads_grains_order
from dataloader.dataset.compile.wrappers import DropNone
from dataloader.dataset.context import default_worker_count, inherited_options, inherited_workers
from dataloader.dataset.map_dataset import MapDataset
from dataloader.engine.restore.resume import Foreign
from dataloader.engine.stages.base import DatasetIterator
from dataloader.iterator import DataLoaderIterator
from dataloader.loader import DataLoader
from dataloader.operations import (
    Batch,
    Operation,
)
from dataloader.operations.padding import BatchAndPad
from dataloader.operations.transforms import ELEMENT, GROUP
from dataloader.options import DatasetOptions, MultiprocessingOptions, ReadOptions, check_bool
from dataloader.samplers import ShardOptions


@dataclasses.dataclass(frozen=True)
class StreamShape:
    """What an engine-backed stream does to the positions it reads.

    Attributes:
        batched: its elements are batches (a ``batch`` on it or on its ``MapDataset``).
        reshaped: a filter or flat map (on it or in its ``MapDataset``) drops or adds
            elements, so outputs are no fixed number of positions.
        shard_options: the ``shard_options`` it was given, or None.
        multiprocessing: its ``mp_prefetch`` options, or None.
        read_options: its read options (``prefetch`` sets them).
    """

    batched: bool
    reshaped: bool
    shard_options: ShardOptions | None
    multiprocessing: MultiprocessingOptions | None
    read_options: ReadOptions

    @property
    def sharded(self) -> bool:
        return self.shard_options is not None

    @property
    def prefetched(self) -> bool:
        """``mp_prefetch`` was called on it (with any worker count)."""
        return self.multiprocessing is not None

    @property
    def computed_ahead(self) -> bool:
        """Worker processes or read-ahead threads compute it (what a mixture refuses)."""
        return bool(self.multiprocessing is not None and self.multiprocessing.num_workers) \
            or self.read_options != ReadOptions()


class LoaderIterDataset(IterDataset):
    """A checkpointable stream built from a ``MapDataset`` (``ds.to_iter_dataset()``).

    Example:
        >>> import dataloader as dl
        >>> ds = dl.MapDataset.range(6).to_iter_dataset().filter(lambda x: x % 2).batch(2)
        >>> it = iter(ds)
        >>> next(it).tolist(), it.get_state()["position"]
        ([1, 3], 4)
    """

    def __init__(
        self,
        parent: MapDataset,
        *,
        operations: Sequence[Operation | Batch] = (),
        seed: int | None = None,
        seed_uses: int | None = None,
        read_options: ReadOptions | None = None,
        shard_options: ShardOptions | None = None,
        multiprocessing: MultiprocessingOptions | None = None,
        worker_init_fn: Callable[[int, int], Any] | None = None,
        allow_nones: bool = False,
        position_of_state: Callable[[dict[str, Any]], int] | None = None,
    ) -> None:
        if not isinstance(parent, MapDataset):
            raise TypeError(f"to_iter_dataset() is called on a MapDataset, got {parent!r}")
        if read_options is not None and not isinstance(read_options, ReadOptions):
            raise TypeError(f"read_options must be a ReadOptions, got {read_options!r}")
        if shard_options is not None and not isinstance(shard_options, ShardOptions):
            raise TypeError(f"shard_options must be a ShardOptions, got {shard_options!r}")
        super().__init__(parent)
        self._operations = tuple(operations)
        if seed is not None:
            self._seed = seed
        if seed_uses is not None:
            self._seed_uses = seed_uses
        self._read_options = read_options or ReadOptions()
        self._shard_options = shard_options
        self._mp = multiprocessing
        self._worker_init_fn = worker_init_fn
        self._allow_nones = check_bool("allow_nones", allow_nones)
        # Set when this is a stream on the engine: reads the streaming iterators' states.
        self._position_of_state = position_of_state
        self._loader: DataLoader | None = None

    def _with(self, **changes: Any) -> LoaderIterDataset:
        fields: dict[str, Any] = {
            "operations": self._operations,
            "seed": self._seed,
            "seed_uses": self._seed_uses,
            "read_options": self._read_options,
            "shard_options": self._shard_options,
            "multiprocessing": self._mp,
            "worker_init_fn": self._worker_init_fn,
            "allow_nones": self._allow_nones,
            "position_of_state": self._position_of_state,
        }
        fields.update(changes)
        return LoaderIterDataset(self._parent, **fields)

    def _then(self, op: Operation | Batch) -> IterDataset:
        if op.runs == GROUP and self._is_batched():
            return super()._then(op)  # a batch of batches, at the iterator level
        if op.runs == ELEMENT and op.needs_index:
            # The engine numbers positions; Grain's index counts the elements that reach
            # the call, which differ after a filter or flat map.
            return super()._then(op)
        return self._with(operations=(*self._operations, op))

    def random_map(self, transform: Any, *, seed: int | None = None) -> IterDataset:
        """Applies ``transform(element, rng)``; ``rng`` depends on (seed, position, operation),
        as in a ``DataLoader`` with the same operations."""
        return self._then(random_map_op(transform, seed, self._seed))

    def seed(self, seed: int) -> LoaderIterDataset:
        """Sets the seed of the ``random_map`` calls that follow."""
        return self._with(seed=check_seed(seed, "seed"), seed_uses=0)

    def batch_and_pad(self, batch_size: int, *, pad_value: Any = 0, mask_key: str = "mask") -> IterDataset:
        """Batches, padding the last short batch to full size with a mask of real rows."""
        return self._then(BatchAndPad(batch_size, pad_value=pad_value, mask_key=mask_key))

    @property
    def batched_by(self) -> Batch | None:
        """The :class:`~dataloader.operations.Batch` of the last step, if it is one (the
        parent's, with no operations of its own)."""
        if not self._operations:
            return self._parent.batched_by
        last = self._operations[-1]
        return last if isinstance(last, Batch) else None

    def _is_batched(self) -> bool:
        return is_batched(self._parent._node) or any(o.runs == GROUP for o in self._operations)

    def _reshaped(self) -> bool:
        return any(o.runs != GROUP and o.reshapes for o in self._operations)

    @property
    def shape(self) -> StreamShape:
        """What the stream does to the positions it reads (what ``ElasticIterator`` and
        the mixtures ask before they take a stream)."""
        return StreamShape(
            batched=self._is_batched(),
            reshaped=self._reshaped() or self._parent.filtered,
            shard_options=self._shard_options,
            multiprocessing=self._mp,
            read_options=self._read_options,
        )

    def configured(self, **changes: Any) -> LoaderIterDataset:
        """The same stream with other settings: ``shard_options``, ``read_options``,
        ``multiprocessing`` (``MultiprocessingOptions``), ``operations``."""
        return self._with(**changes)

    def prefetch(self, buffer_size: int | MultiprocessingOptions = 2) -> LoaderIterDataset:
        """Reads up to ``buffer_size`` records ahead in a thread (without workers; see
        :class:`~dataloader.ReadOptions`).

        Given ``MultiprocessingOptions`` (Grain's deprecated spelling) it is ``mp_prefetch``.
        """
        if isinstance(buffer_size, MultiprocessingOptions):
            return self.mp_prefetch(buffer_size)
        ro = self._read_options
        return self._with(read_options=dataclasses.replace(
            ro, num_threads=max(1, ro.num_threads), prefetch_buffer_size=buffer_size))

    def mp_prefetch(
        self,
        options: MultiprocessingOptions | None = None,
        worker_init_fn: Callable[[int, int], Any] | None = None,
        sequential_slice: bool = False,
    ) -> LoaderIterDataset:
        """Computes the stream in ``options.num_workers`` processes (default: one per CPU),
        or threads (``options.worker_kind``).

        The output is the same for every number of workers, and so is every state.
        """
        if options is None:
            options = MultiprocessingOptions(num_workers=default_worker_count())
        if not isinstance(options, MultiprocessingOptions):
            raise TypeError(f"mp_prefetch needs MultiprocessingOptions, got {options!r}")
        return self._with(multiprocessing=options, worker_init_fn=worker_init_fn)

    def _as_map_dataset(self) -> MapDataset:
        ds = self._parent
        for op in self._operations:
            assert op.runs != GROUP, "mix refuses batched streams"
            ds = ds._apply(op)
        return ds

    def _build_loader(
        self, mp: MultiprocessingOptions, init_fn: Any, options: DatasetOptions | None = None
    ) -> DataLoader:
        compiled = self._parent._compiled
        operations = list(compiled.operations)
        if self._allow_nones:  # keep the holes of flat_map; filters still drop
            operations = [op for op in operations if not isinstance(op, DropNone)]
        elif has_user_dataset(self._parent._node):
            operations = [*operations, DropNone()]  # a dataset of your own may return None
        return DataLoader(
            compiled.source,
            compiled.sampler,
            [*operations, *self._operations],
            worker_count=mp.num_workers,
            worker_buffer_size=mp.per_worker_buffer_size,
            worker_kind=mp.worker_kind,
            shard_options=self._shard_options,
            read_options=self._read_options,
            worker_init_fn=init_fn,
            options=options,
        )

    @property
    def loader(self) -> DataLoader:
        """The ``DataLoader`` this stream runs as."""
        if self._loader is None:
            self._loader = self._build_loader(self._mp or MultiprocessingOptions(), self._worker_init_fn)
        return self._loader

    def __iter__(self) -> DatasetIterator:
        return self._new_iterator()

    def _new_iterator(self) -> DatasetIterator:
        options = inherited_options()
        if self._mp is None:
            inherited = inherited_workers()
            if inherited is not None:  # built under an mp_prefetch further down the chain
                return self._iterator_of(self._build_loader(*inherited, options))
        if options is not None:  # under a WithOptionsIterDataset
            return self._iterator_of(self._build_loader(self._mp or MultiprocessingOptions(), self._worker_init_fn, options))
        return self._iterator_of(self.loader)

    def _iterator_of(self, loader: DataLoader) -> DatasetIterator:
        """``loader.iterator()``, whose engine also reads the states that are not its own:
        a Grain dataset iterator's (whether the order is Grain's, and positions per index
        of a batched MapDataset) and, for a stream on the engine, the streaming
        iterators' (:mod:`dataloader.dataset.streams.lowering`). With a packer the tail
        nests the loader's state in its own: such states do not reach the engine."""
        if loader.stage_operations:
            return loader.iterator()
        node = self._parent._node
        per_index = (self._parent._compiled.batch_size or 1) if is_batched(node) else 1
        foreign = Foreign(reads_grains_order(node), per_index, self._position_of_state)
        return DataLoaderIterator(dataclasses.replace(loader.engine, foreign=foreign))

    def __repr__(self) -> str:
        ops = "".join(f".apply({o.name})" for o in self._operations)
        workers = f".mp_prefetch({self._mp})" if self._mp is not None and self._mp.num_workers else ""
        return f"{self._parent!r}.to_iter_dataset(){ops}{workers}"


def mix_iter_datasets(datasets: Sequence[Any], weights: Sequence[float] | None) -> IterDataset:
    """``IterDataset.mix`` of engine-backed streams: one engine, one state (positions).

    Proportions are exact over positions of the mixture; a filter inside a component
    drops elements after they were drawn. Components must not be batched or prefetched
    yet: ``IterDataset.mix`` sends other mixtures to the iterator-level one
    (:mod:`dataloader.dataset.experimental.mix`); the checks below guard direct calls.
    """
    components = []
    for i, d in enumerate(datasets):
        if not isinstance(d, LoaderIterDataset):
            raise TypeError(f"IterDataset.mix: datasets[{i}] is {d!r}, expected an IterDataset")
        if d.shape.batched:
            raise ValueError(
                f"IterDataset.mix: datasets[{i}] is batched ({d!r}); mix elements and "
                f"batch the mixture: IterDataset.mix([...]).batch(n)"
            )
        if d.shape.computed_ahead:
            raise ValueError(
                f"IterDataset.mix: datasets[{i}] is prefetched; call prefetch or "
                f"mp_prefetch on the mixture instead"
            )
        components.append(d._as_map_dataset())
    shardings = {d.shape.shard_options for d in datasets}
    if len(shardings) != 1:
        raise ValueError(
            "IterDataset.mix: the datasets have different shard_options; shard them "
            "alike (the mixture is sharded as they are)"
        )
    return LoaderIterDataset(MapDataset._mix(components, weights, until_exhausted=True),
                             shard_options=shardings.pop())
