"""Argument checks and operation wrapping shared by ``MapDataset`` and ``IterDataset``."""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from dataloader.dataset.compile.wrappers import SeededRandomMap
from dataloader.operations import (
    Batch,
    FilterTransform,
    FlatMapTransform,
    MapTransform,
    MapWithIndexTransform,
    Operation,
    RandomMapTransform,
)
from dataloader.operations.transforms import refuse_class

# Key widths of what the seeds feed: permutations (IndexSampler) take 63 bits, per-record
# generators (record_rng) 64.
SHUFFLE_BITS = 63
RNG_BITS = 64


def check_seed(seed: Any, what: str, *, bits: int | None = None) -> int:
    """``seed`` checked: any non-negative integer, as Grain takes (it seeds numpy's
    ``SeedSequence``/``Philox``, which take integers of any size).

    Every seed of the dataset API goes through here. With ``bits``, a seed too wide for
    the key it becomes is folded into ``[0, 2**bits)`` through ``SeedSequence`` (a pure
    function of the seed, so randomness stays reproducible); narrower seeds are kept as
    they are, so their orders and augmentations do not change.

    Raises:
        ValueError: ``seed`` is not an integer, or is negative.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"{what} must be a non-negative integer, got {seed!r}")
    seed = int(seed)
    if bits is not None and seed >> bits:
        word = int(np.random.SeedSequence(seed).generate_state(1, np.uint64)[0])
        seed = word >> (64 - bits)
    return seed


def derive_seed(seed: int, k: int) -> int:
    """The ``k``-th seed derived from ``seed`` (``k >= 1``), unrelated to its neighbours."""
    word = np.random.SeedSequence(seed, spawn_key=(0x5EED, k)).generate_state(1, np.uint64)[0]
    return int(word) >> 1


def as_operation(transform: Any, kind: type, method: str) -> Any:
    """``transform`` as an operation of ``kind``, wrapping a plain function."""
    if isinstance(transform, kind):
        return transform
    # An operation's class is callable, so it would pass for a function below; a plain
    # class (ds.map(str)) is a function of the element and stays one.
    if isinstance(transform, type) and issubclass(transform, (Operation, Batch)):
        refuse_class(transform, f"{method}()'s argument")
    others = (MapTransform, RandomMapTransform, FilterTransform, FlatMapTransform, MapWithIndexTransform, Batch)
    if isinstance(transform, others):
        raise TypeError(
            f"{method}() got a {type(transform).__name__} ({transform!r}); pass it to the "
            f"matching method (map, random_map, filter, flat_map, map_with_index or batch)"
        )
    if not callable(transform):
        raise TypeError(f"{method}() needs a function or a {kind.__name__}, got {transform!r}")
    return kind(transform)


def random_map_op(transform: Any, seed: int | None, inherited: int | None) -> SeededRandomMap:
    op = as_operation(transform, RandomMapTransform, "random_map")
    if seed is None:
        seed = inherited
    if seed is None:
        raise ValueError(
            f"random_map({op.name}) needs a seed so that augmentations are reproducible; "
            f"call .seed(...) earlier in the chain or pass random_map(..., seed=...)"
        )
    return SeededRandomMap(op, check_seed(seed, "random_map seed", bits=RNG_BITS))


def check_size(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{what} must be a positive integer, got {value!r}")
    return int(value)
