"""``IterDataset`` and ``DatasetIterator``: the iterable half of the dataset API, as in Grain.

An ``IterDataset`` is a recipe (immutable; every chained call returns a new one) and
``iter(ds)`` makes a :class:`DatasetIterator`, which yields elements and can say where it
is (``get_state()``, a small JSON-able dict) and go back there (``set_state()``). Users
write their own by subclassing both, exactly as for Grain::

    class Squares(IterDataset[int]):
        def __iter__(self):
            return SquaresIterator()

    class SquaresIterator(DatasetIterator[int]):
        def __init__(self):
            super().__init__()
            self._i = 0
        def __next__(self):
            self._i += 1
            return (self._i - 1) ** 2
        def get_state(self):
            return {"i": self._i}
        def set_state(self, state):
            self._i = state["i"]

Two kinds of ``IterDataset`` run here, and they compose freely:

* **Engine-backed**: ``MapDataset.to_iter_dataset()`` and the ``map``/``filter``/
  ``flat_map``/``random_map``/``batch`` calls chained on it compile to a ``DataLoader``
  (:class:`~dataloader.dataset.iter_dataset.LoaderIterDataset`): records are read by
  position in worker processes, the state is one position, a restore is O(1).
* **Streams on the engine**: a Parquet stream (``ParquetIterDataset(...)``, or a finite
  list of one-file ones interleaved and window-shuffled, as MaxText builds it) followed
  by ``map``/``filter``/``flat_map``/``random_map``/``batch`` (or by ``mp_prefetch``)
  compiles the same way, over a source whose record ``p`` is row ``p`` of the stream in
  its order: the rows and the functions are computed in worker processes, a run of
  consecutive rows per unit, and the state is one position
  (:mod:`dataloader.dataset.streams.lowering`). A stream iterated alone reads in order
  in this process, with its file-and-row state.
* **Iterator-level**: everything else (packing, interleaving, window shuffles, thread
  prefetch, user-defined datasets, gzip or remote TFRecord streams, mixes of those).
  Such a stage runs in the consumer's process on the ordered stream of its parents, so
  its output never depends on the number of workers; its state nests its parents'
  states (``{"parent": ..., ...}``), as Grain's do.
* **Element-wise calls after an iterator-level stage** (``map``/``random_map``/
  ``filter``/``flat_map``): under ``mp_prefetch`` (or ``GRANARY_WORKER_COUNT``) they
  run in the worker processes, on units of 64 consecutive elements that the consumer's
  process reads from the stage and ships through shared memory
  (:mod:`dataloader.dataset.transformations.pooled`); without workers, element by
  element in the consumer's process. A ``batch`` after them stacks in the consumer.

``mp_prefetch`` on a pipeline with iterator-level stages gives the worker processes to
its engine-backed parts (including a Parquet stream and the calls chained on it) and to
the element-wise calls after iterator-level stages, and computes the iterator-level
stages ahead in a thread. Output and states are the same for every worker count.
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from dataloader.dataset.arguments import RNG_BITS, as_operation, check_seed, derive_seed
from dataloader.dataset.compile.wrappers import SeededRandomMap
from dataloader.engine.stages.base import DatasetIterator
from dataloader.operations import (
    Batch,
    FilterTransform,
    FlatMapTransform,
    MapTransform,
    Operation,
    RandomMapTransform,
)
from dataloader.operations.transforms import ELEMENT, MANY, runs_of

if TYPE_CHECKING:
    from dataloader.options import MultiprocessingOptions

T = TypeVar("T")
S = TypeVar("S")


class IterDataset(Generic[T], abc.ABC):
    """A dataset that is iterated, not indexed: Grain's ``IterDataset``.

    Subclass it (define ``__iter__`` returning a :class:`DatasetIterator`) for a dataset
    of your own, or build one with ``MapDataset.to_iter_dataset()`` and chain calls.

    Args:
        parents: the datasets this one reads (``IterDataset`` or ``MapDataset``).
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("__iter__")
        if own is not None and own not in _WITH_PIPELINE_OPTIONS:
            cls.__iter__ = _with_pipeline_options(own)  # type: ignore[method-assign]

    def __init__(self, parents: Any = ()) -> None:
        if isinstance(parents, (IterDataset, _map_dataset_class())):
            parents = (parents,)
        self._parents: tuple[Any, ...] = tuple(parents)
        seeds = {getattr(p, "_seed", None) for p in self._parents} - {None}
        # The seed of the calls that follow: inherited while the parents agree on one.
        self._seed: int | None = seeds.pop() if len(seeds) == 1 else None
        self._seed_uses = max((getattr(p, "_seed_uses", 0) for p in self._parents), default=0)

    @property
    def parents(self) -> tuple[Any, ...]:
        return self._parents

    @property
    def batched_by(self) -> Batch | None:
        """The :class:`~dataloader.operations.Batch` whose batches are this dataset's
        elements, when a batch is its last step (None otherwise, or not known): what
        ``get_element_spec`` asks to give a kept remainder's leading dimension as None."""
        return None

    @property
    def _parent(self) -> Any:
        if len(self._parents) != 1:
            raise ValueError(f"{type(self).__name__} has {len(self._parents)} parents, not one")
        return self._parents[0]

    @abc.abstractmethod
    def __iter__(self) -> DatasetIterator[T]:
        """A new iterator, at the start of the stream."""

    # -- chaining --------------------------------------------------------------------

    def pipe(self, func: Callable[..., S], /, *args: Any, **kwargs: Any) -> S:
        """``func(self, *args, **kwargs)``: chain a transformation that is not a method."""
        return func(self, *args, **kwargs)

    def apply(self, transformations: Any) -> IterDataset:
        """Applies one operation or a list of them (map, random map, filter, flat map, batch)."""
        from dataloader.dataset.transformations.apply import apply_transformations

        return apply_transformations(self, transformations)

    def seed(self, seed: int) -> IterDataset[T]:
        """Sets the seed of the random calls that follow (``random_map``)."""
        out = self._copy()
        out._seed, out._seed_uses = check_seed(seed, "seed"), 0
        return out

    def map(self, transform: Any) -> IterDataset:
        """Applies ``transform`` to every element (a ``FlatMapTransform`` flattens, as in Grain)."""
        if runs_of(transform) == ELEMENT and transform.returns == MANY:
            return self.flat_map(transform)
        return self._then(as_operation(transform, MapTransform, "map"))

    def random_map(self, transform: Any, *, seed: int | None = None) -> IterDataset:
        """Applies ``transform(element, rng)`` with a generator of (seed, element index)."""
        op = as_operation(transform, RandomMapTransform, "random_map")
        out_seed, uses = self._random_seed(op, seed)
        out = self._then(SeededRandomMap(op, out_seed))
        out._seed_uses = uses
        return out

    def filter(self, transform: Any) -> IterDataset[T]:
        """Keeps the elements for which ``transform`` is true."""
        return self._then(as_operation(transform, FilterTransform, "filter"))

    def flat_map(self, transform: Any) -> IterDataset:
        """Replaces every element by the elements ``transform`` returns (a sequence)."""
        return self._then(as_operation(transform, FlatMapTransform, "flat_map"))

    def map_with_index(self, transform: Any) -> IterDataset:
        """Applies ``transform(index, element)``; ``index`` counts this stage's input."""
        from dataloader.dataset.transformations.elementwise import with_index

        return self._then(with_index(transform))

    def batch(
        self,
        batch_size: int,
        *,
        drop_remainder: bool = False,
        batch_fn: Callable[[Sequence[Any]], Any] | None = None,
    ) -> IterDataset:
        """Groups consecutive elements into batches of ``batch_size``."""
        return self._then(Batch(batch_size, drop_remainder=drop_remainder, batch_fn=batch_fn))

    def bucket_by_length(self, *args: Any, **kwargs: Any) -> IterDataset:
        """Batches elements of similar length together, padded (tf.data's
        ``bucket_by_sequence_length``): the arguments are
        :class:`~dataloader.operations.BucketByLength`'s (``element_length_func``,
        ``bucket_boundaries``, ``bucket_batch_sizes``, ...)."""
        from dataloader.operations import BucketByLength

        return self.apply(BucketByLength(*args, **kwargs))

    def prefetch(self, buffer_size: int | MultiprocessingOptions = 2) -> IterDataset[T]:
        """Computes elements ahead in a background thread (``MultiprocessingOptions``:
        ``mp_prefetch``, as in Grain)."""
        from dataloader.dataset.transformations.prefetch import ThreadPrefetchIterDataset
        from dataloader.options import MultiprocessingOptions

        if isinstance(buffer_size, MultiprocessingOptions):
            return self.mp_prefetch(buffer_size)
        return ThreadPrefetchIterDataset(self, prefetch_buffer_size=buffer_size)

    def mp_prefetch(
        self,
        options: MultiprocessingOptions | None = None,
        worker_init_fn: Callable[[int, int], Any] | None = None,
        sequential_slice: bool = False,
    ) -> IterDataset[T]:
        """Computes the stream with worker processes (default: one per CPU).

        The engine-backed part of the pipeline, and the element-wise calls chained after
        iterator-level stages, run in ``options.num_workers`` processes; iterator-level
        stages run ahead in a thread of this process. The output is the same for every
        number of workers, and so is every state.
        ``sequential_slice`` is accepted for Grain's signature: the output does not
        depend on how work is split, so there is nothing to choose.
        """
        from dataloader.dataset.streams.lowering import on_engine
        from dataloader.dataset.transformations.prefetch import MultiprocessPrefetchIterDataset

        engine = on_engine(self)  # a stream with a random-access form: read in the workers
        if engine is not None:
            return engine.mp_prefetch(options, worker_init_fn, sequential_slice)
        return MultiprocessPrefetchIterDataset(self, options, worker_init_fn)

    @staticmethod
    def mix(
        datasets: Sequence[IterDataset] | Mapping[str, IterDataset],
        weights: Any = None,
        *,
        weight_by: str = "elements",
        length: Callable[[Any], int] | None = None,
    ) -> IterDataset:
        """Interleaves streams by weight, until one of them is exhausted.

        A list of engine-backed streams compiles to one engine (one position as state);
        anything else, and every dict of named datasets (whose states restore by name,
        with other weights or components), mixes at the iterator level. See
        :mod:`dataloader.dataset.experimental.mix`.

        Args:
            datasets: the components, a list or a dict by name.
            weights: one weight per component (a dict by name for a dict), a
                :class:`~dataloader.WeightSchedule`, or ``None`` for equal weights.
            weight_by: ``"elements"`` (default) or ``"tokens"``: each component's share
                of the tokens follows the weights, counted with ``length``
                (:mod:`dataloader.dataset.experimental.token_mix`).
            length: ``length(element)``, its number of tokens, for ``weight_by="tokens"``.
        """
        from dataloader.dataset.experimental.mix import mix

        return mix(datasets, weights, weight_by=weight_by, length=length)

    # -- helpers for subclasses -------------------------------------------------------

    def _then(self, op: Operation | Batch) -> IterDataset:
        """This stream followed by ``op``: on the engine where the stream has a
        random-access form (:mod:`dataloader.dataset.streams.lowering`), else at the
        iterator level; engine-backed datasets override it."""
        from dataloader.dataset.streams.lowering import on_engine
        from dataloader.dataset.transformations.elementwise import OperationIterDataset

        engine = on_engine(self)
        if engine is not None:
            return engine._then(op)
        return OperationIterDataset(self, op)

    def _copy(self) -> IterDataset[T]:
        """A view of this dataset (same iterator) whose seed can be set separately."""
        from dataloader.dataset.transformations.elementwise import SeedScope

        return SeedScope(self)

    def _random_seed(self, op: RandomMapTransform, seed: int | None) -> tuple[int, int]:
        """The seed of a random map at this point of the chain, and the seed uses after it."""
        if seed is not None:
            return check_seed(seed, "random_map seed", bits=RNG_BITS), self._seed_uses
        if op.rng_seed is not None:
            return check_seed(op.rng_seed, "rng_seed", bits=RNG_BITS), self._seed_uses
        if self._seed is None:
            raise ValueError(
                f"random_map({op.name}) needs a seed so that augmentations are reproducible; "
                f"call .seed(...) earlier in the chain or pass random_map(..., seed=...)"
            )
        uses = self._seed_uses + 1
        return derive_seed(self._seed, uses), uses

    def __repr__(self) -> str:
        inner = ", ".join(repr(p) for p in self._parents)
        return f"{type(self).__name__}({inner})"


# The __iter__ wrappers made by _with_pipeline_options (a subclass of a subclass inherits
# its parent's, already wrapped: never wrapped twice).
_WITH_PIPELINE_OPTIONS: set[Callable[[Any], Any]] = set()


def _with_pipeline_options(iter_fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``iter_fn`` (a subclass's ``__iter__``) run with the options of the pipeline's
    ``WithOptionsIterDataset`` calls when it is the outermost ``iter()``, so they reach
    the datasets after them as well as before (Grain's rule)."""

    @functools.wraps(iter_fn)
    def __iter__(self: Any) -> Any:
        from dataloader.dataset.context import building

        with building(self):
            return iter_fn(self)

    _WITH_PIPELINE_OPTIONS.add(__iter__)
    return __iter__


def _map_dataset_class() -> type:
    from dataloader.dataset.map_dataset import MapDataset

    return MapDataset
