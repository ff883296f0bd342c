"""Engine operations that the dataset API builds around the user's operations.

* :class:`SeededRandomMap` gives a random map its own seed (``rng_seed``), so its
  generators do not depend on the seed of the sampler the chain compiles to.
* The ``NonePassing*`` operations let ``None`` through untouched, as Grain's
  ``MapDataset`` transformations do: a dataset of the user's own may return ``None``
  (no element), and the functions chained after it never see it.
* The ``Tagged*`` operations apply an operation to the elements of some parts of a
  :class:`~dataloader.dataset.compile.concat_source.ConcatSource` only (elements travel as
  ``(part, element)``), which is how ``mix([a.map(f), b])`` runs ``f`` on ``a`` alone
  in one engine pipeline. :class:`Untag` drops the tag once those are done.

Each keeps the wrapped operation's ``name``, so states and error messages read as if
the user's operation ran directly (and match a ``DataLoader`` given the same operations).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from dataloader.operations import FilterTransform, MapTransform, Operation, RandomMapTransform
from dataloader.operations.transforms import KEEP, ONE


class _Wrapper:
    """Runs ``inner``'s function under ``inner``'s name (mixed into an operation class)."""

    def __init__(self, inner: Operation) -> None:
        self._f: Callable[..., Any] = inner.element_fn()
        self._name = inner.name
        super().__init__()

    @property
    def name(self) -> str:
        return self._name


class SeededRandomMap(_Wrapper, RandomMapTransform):
    """A random map that draws from ``record_rng(rng_seed, global position, ...)``."""

    def __init__(self, inner: RandomMapTransform, rng_seed: int) -> None:
        super().__init__(inner)
        self.rng_seed = rng_seed

    def random_map(self, element: Any, rng: np.random.Generator) -> Any:
        return self._f(element, rng)


class _Tagged(_Wrapper):
    """``inner`` applied to the elements of ``parts`` only."""

    def __init__(self, inner: Operation, parts: frozenset[int]) -> None:
        super().__init__(inner)
        self._parts = parts


class TaggedMap(_Tagged, MapTransform):
    def map(self, element: Any) -> Any:
        part, x = element
        return (part, self._f(x)) if part in self._parts else element


class TaggedRandomMap(_Tagged, RandomMapTransform):
    def __init__(self, inner: RandomMapTransform, parts: frozenset[int]) -> None:
        super().__init__(inner, parts)
        self.rng_seed = inner.rng_seed

    def random_map(self, element: Any, rng: np.random.Generator) -> Any:
        part, x = element
        return (part, self._f(x, rng)) if part in self._parts else element


class TaggedFilter(_Tagged, FilterTransform):
    def filter(self, element: Any) -> bool:
        part, x = element
        return bool(self._f(x)) if part in self._parts else True


class Untag(MapTransform):
    """Drops the part tag: ``(part, element) -> element``."""

    def map(self, element: Any) -> Any:
        return element[1]

    @property
    def name(self) -> str:
        return "Untag"


class DropNone(FilterTransform):
    """Drops ``None``: what a filtered dataset used as a source returns for a dropped element."""

    def filter(self, element: Any) -> bool:
        return element is not None

    @property
    def name(self) -> str:
        return "DropNone"


class NonePassingMap(_Wrapper, MapTransform):
    def map(self, element: Any) -> Any:
        return None if element is None else self._f(element)


class NonePassingRandomMap(_Wrapper, RandomMapTransform):
    def __init__(self, inner: RandomMapTransform) -> None:
        super().__init__(inner)
        self.rng_seed = inner.rng_seed

    def random_map(self, element: Any, rng: np.random.Generator) -> Any:
        return None if element is None else self._f(element, rng)


class NonePassingFilter(_Wrapper, FilterTransform):
    """Keeps ``None`` (no element stays no element; iteration drops it at the end)."""

    def filter(self, element: Any) -> bool:
        return element is None or bool(self._f(element))


def none_passing(op: Operation) -> Operation:
    """``op``, letting ``None`` through untouched (a flat map has no such form: refused)."""
    if op.needs_seed:
        return NonePassingRandomMap(op)
    if op.returns == KEEP:
        return NonePassingFilter(op)
    if op.returns == ONE and not op.needs_index:
        return NonePassingMap(op)
    return op


def tagged(op: Operation, parts: frozenset[int]) -> Operation:
    """``op`` restricted to the elements of ``parts``."""
    if op.needs_seed:
        return TaggedRandomMap(op, parts)
    if op.returns == KEEP:
        return TaggedFilter(op, parts)
    assert op.returns == ONE and not op.needs_index, op
    return TaggedMap(op, parts)
