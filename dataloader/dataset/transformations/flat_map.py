"""Grain's ``experimental.FlatMapMapDataset`` and ``FlatMapIterDataset``: its class names
for what ``ds.flat_map(transform)`` builds.

Grain code that constructs them, ``FlatMapMapDataset(ds, SplitInTwo())``, gets here what
the method gives: the same dataset as ``ds.flat_map(SplitInTwo())``, compiled onto the
engine like every other call (so they are functions that return that dataset, not
classes of their own; ``isinstance`` against them is not available).

Example:
    >>> import dataloader as dl
    >>> split = dl.FlatMapTransform(lambda x: [x, -x], max_fan_out=2)
    >>> ds = dl.experimental.FlatMapMapDataset(dl.MapDataset.range(1, 3), split)
    >>> len(ds), list(ds)
    (4, [1, -1, 2, -2])
    >>> list(dl.experimental.FlatMapIterDataset(dl.MapDataset.range(1, 3).to_iter_dataset(), split))
    [1, -1, 2, -2]
"""

from __future__ import annotations

from typing import Any

from dataloader.dataset.base import IterDataset
from dataloader.operations import FlatMapTransform


def _checked(parent: Any, transform: Any, name: str, kind: type, method: str) -> None:
    if not isinstance(parent, kind):
        raise TypeError(
            f"{name} needs a {kind.__name__} as its parent, got {type(parent).__name__}: "
            f"{parent!r}; use {method} on what you have"
        )
    if not isinstance(transform, FlatMapTransform):
        raise TypeError(
            f"{name} needs a FlatMapTransform (Grain's transforms.FlatMap), got {transform!r}; "
            f"wrap a function as FlatMapTransform(fn, max_fan_out=...)"
        )


def FlatMapMapDataset(parent: Any, transform: FlatMapTransform) -> Any:
    """``parent.flat_map(transform)`` on a ``MapDataset``: ``transform.max_fan_out`` slots
    per element, ``None`` where an element has fewer outputs (Grain's layout).

    Raises:
        TypeError: ``parent`` is not a ``MapDataset``, or ``transform`` not a
            ``FlatMapTransform``.
        ValueError: ``transform`` has no ``max_fan_out``.
    """
    from dataloader.dataset.map_dataset import MapDataset

    _checked(parent, transform, "FlatMapMapDataset", MapDataset, "FlatMapIterDataset (or .flat_map())")
    return parent.flat_map(transform)


def FlatMapIterDataset(parent: Any, transform: FlatMapTransform) -> IterDataset:
    """``parent.flat_map(transform)`` on an ``IterDataset``: every output of each element,
    in order (no slots, so ``max_fan_out`` is not needed).

    Raises:
        TypeError: ``parent`` is not an ``IterDataset``, or ``transform`` not a
            ``FlatMapTransform``.
    """
    _checked(parent, transform, "FlatMapIterDataset", IterDataset,
             "FlatMapMapDataset on a MapDataset (or .to_iter_dataset() first)")
    return parent.flat_map(transform)
