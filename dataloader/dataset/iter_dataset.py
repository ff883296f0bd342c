"""``IterDataset``: the checkpointable stream of a ``MapDataset``, chained as in Grain.

An ``IterDataset`` is a ``DataLoader`` under construction: its ``MapDataset`` compiles to
a source, a sampler and operations, the calls here append operations (``map``,
``random_map``, ``filter``, ``batch``) or set how it runs (``prefetch``,
``mp_prefetch``), and ``iter(ds)`` is the loader's own iterator. So it has the loader's
guarantees: ``get_state()`` describes the last element handed out, ``set_state()``
resumes in O(1) with any worker count, a state made for another pipeline is refused,
and the output does not depend on ``num_workers``.

Operations appended after ``mp_prefetch`` run in the workers too; being pure functions
of their input (and of their generator), they give the same output wherever they run.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from dataloader.dataset.arguments import as_operation, check_seed, random_map_op
from dataloader.dataset.compile.nodes import is_batched
from dataloader.dataset.map_dataset import MapDataset
from dataloader.iterator import DataLoaderIterator
from dataloader.loader import DataLoader
from dataloader.operations import (
    Batch,
    FilterTransform,
    MapTransform,
    Operation,
    RandomMapTransform,
)
from dataloader.operations.padding import BatchAndPad
from dataloader.options import MultiprocessingOptions, ReadOptions
from dataloader.samplers import ShardOptions


class IterDataset:
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
        read_options: ReadOptions | None = None,
        shard_options: ShardOptions | None = None,
        multiprocessing: MultiprocessingOptions | None = None,
        worker_init_fn: Callable[[int, int], Any] | None = None,
    ) -> None:
        if not isinstance(parent, MapDataset):
            raise TypeError(f"IterDataset is built from a MapDataset, got {parent!r}")
        if read_options is not None and not isinstance(read_options, ReadOptions):
            raise TypeError(f"read_options must be a ReadOptions, got {read_options!r}")
        if shard_options is not None and not isinstance(shard_options, ShardOptions):
            raise TypeError(f"shard_options must be a ShardOptions, got {shard_options!r}")
        self._parent = parent
        self._operations = tuple(operations)
        self._seed = parent._seed if seed is None else seed
        self._read_options = read_options or ReadOptions()
        self._shard_options = shard_options
        self._mp = multiprocessing or MultiprocessingOptions()
        self._worker_init_fn = worker_init_fn
        self._loader: DataLoader | None = None

    def _then(self, **changes: Any) -> IterDataset:
        fields: dict[str, Any] = {
            "operations": self._operations,
            "seed": self._seed,
            "read_options": self._read_options,
            "shard_options": self._shard_options,
            "multiprocessing": self._mp,
            "worker_init_fn": self._worker_init_fn,
        }
        fields.update(changes)
        return IterDataset(self._parent, **fields)

    def _append(self, op: Operation | Batch) -> IterDataset:
        return self._then(operations=(*self._operations, op))

    def seed(self, seed: int) -> IterDataset:
        """Sets the seed of the ``random_map`` calls that follow."""
        return self._then(seed=check_seed(seed, "seed"))

    def map(self, transform: MapTransform | Callable[[Any], Any]) -> IterDataset:
        return self._append(as_operation(transform, MapTransform, "map"))

    def random_map(
        self, transform: RandomMapTransform | Callable[..., Any], *, seed: int | None = None
    ) -> IterDataset:
        return self._append(random_map_op(transform, seed, self._seed))

    def filter(self, transform: FilterTransform | Callable[[Any], bool]) -> IterDataset:
        return self._append(as_operation(transform, FilterTransform, "filter"))

    def batch(
        self,
        batch_size: int,
        *,
        drop_remainder: bool = False,
        batch_fn: Callable[[list[Any]], Any] | None = None,
    ) -> IterDataset:
        """Groups consecutive elements (after any filter) into batches."""
        return self._add_batch(Batch(batch_size, drop_remainder=drop_remainder, batch_fn=batch_fn))

    def batch_and_pad(self, batch_size: int, *, pad_value: Any = 0, mask_key: str = "mask") -> IterDataset:
        """Batches, padding the last short batch to full size with a mask of real rows."""
        return self._add_batch(BatchAndPad(batch_size, pad_value=pad_value, mask_key=mask_key))

    def _add_batch(self, op: Batch) -> IterDataset:
        if self._is_batched():
            raise ValueError(
                f"{op.name}: this stream is batched already ({self!r}); a pipeline has "
                f"one batch, so put further grouping in its batch_fn"
            )
        return self._append(op)

    def _is_batched(self) -> bool:
        return is_batched(self._parent._node) or any(isinstance(o, Batch) for o in self._operations)

    def prefetch(self, buffer_size: int | MultiprocessingOptions = 2) -> IterDataset:
        """Computes up to ``buffer_size`` work units ahead in a thread (without workers).

        Given ``MultiprocessingOptions`` (Grain's deprecated spelling) it is ``mp_prefetch``.
        """
        if isinstance(buffer_size, MultiprocessingOptions):
            return self.mp_prefetch(buffer_size)
        ro = self._read_options
        options = ReadOptions(max(1, ro.num_threads), buffer_size, ro.unit_size)
        return self._then(read_options=options)

    def mp_prefetch(
        self,
        options: MultiprocessingOptions | None = None,
        worker_init_fn: Callable[[int, int], Any] | None = None,
    ) -> IterDataset:
        """Computes the stream in ``options.num_workers`` processes (default: one per CPU).

        The output is the same for every number of workers, and so is every state.
        """
        if options is None:
            options = MultiprocessingOptions(num_workers=os.cpu_count() or 1)
        if not isinstance(options, MultiprocessingOptions):
            raise TypeError(f"mp_prefetch needs MultiprocessingOptions, got {options!r}")
        return self._then(multiprocessing=options, worker_init_fn=worker_init_fn)

    @staticmethod
    def mix(datasets: Sequence[IterDataset], weights: Sequence[float] | None = None) -> IterDataset:
        """Interleaves streams by weight, as :meth:`MapDataset.mix` (one engine, one state).

        Proportions are exact over positions of the mixture; a filter inside a
        component drops elements after they were drawn. Components must not be
        batched or prefetched yet: batch and prefetch the mixture.
        """
        components = []
        for i, d in enumerate(datasets):
            if not isinstance(d, IterDataset):
                raise TypeError(f"IterDataset.mix: datasets[{i}] is {d!r}, expected an IterDataset")
            if d._is_batched():
                raise ValueError(
                    f"IterDataset.mix: datasets[{i}] is batched ({d!r}); mix elements and "
                    f"batch the mixture: IterDataset.mix([...]).batch(n)"
                )
            if d._mp.num_workers or d._read_options != ReadOptions():
                raise ValueError(
                    f"IterDataset.mix: datasets[{i}] is prefetched; call prefetch or "
                    f"mp_prefetch on the mixture instead"
                )
            components.append(d._as_map_dataset())
        shardings = {d._shard_options for d in datasets}
        if len(shardings) != 1:
            raise ValueError(
                "IterDataset.mix: the datasets have different shard_options; shard them "
                "alike (the mixture is sharded as they are)"
            )
        mixed = MapDataset.mix(components, weights)
        return IterDataset(mixed, shard_options=shardings.pop())

    def _as_map_dataset(self) -> MapDataset:
        ds = self._parent
        for op in self._operations:
            assert not isinstance(op, Batch), "mix refuses batched streams"
            ds = ds._apply(op)
        return ds

    @property
    def loader(self) -> DataLoader:
        """The ``DataLoader`` this stream runs as."""
        if self._loader is None:
            compiled = self._parent._compiled
            self._loader = DataLoader(
                compiled.source,
                compiled.sampler,
                [*compiled.operations, *self._operations],
                worker_count=self._mp.num_workers,
                worker_buffer_size=self._mp.per_worker_buffer_size,
                shard_options=self._shard_options,
                read_options=self._read_options,
                worker_init_fn=self._worker_init_fn,
            )
        return self._loader

    def __iter__(self) -> DataLoaderIterator:
        return self.loader.iterator()

    def __repr__(self) -> str:
        ops = "".join(f".apply({o.name})" for o in self._operations)
        workers = f".mp_prefetch({self._mp})" if self._mp.num_workers else ""
        return f"{self._parent!r}.to_iter_dataset(){ops}{workers}"
