"""Grain's ``apply`` / ``apply_transformations`` and the introspection helpers
(``get_element_spec``, ``get_next_index``, ``set_next_index``).

``ds.apply([t1, t2, ...])`` dispatches each operation to the matching chained call, so a
list of operations written for a ``DataLoader`` (or Grain's ``transforms``) builds the
same pipeline in the chained style.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from dataloader.operations.transforms import (
    ELEMENT,
    GROUP,
    KEEP,
    MANY,
    STREAM,
    refuse_class,
    runs_of,
)


def _element_call(ds: Any, op: Any) -> Any:
    """``ds`` with the chained call that fits what the element operation declares."""
    if op.needs_seed:
        return ds.random_map(op)
    if op.needs_index:
        return ds.map_with_index(op)
    if op.returns == KEEP:
        return ds.filter(op)
    if op.returns == MANY:
        return ds.flat_map(op)
    return ds.map(op)


def apply_transformations(ds: Any, transformations: Any) -> Any:
    """``ds`` with each operation of ``transformations`` (one, or a list) applied in order.

    Raises:
        TypeError: an item is not an operation (map, random map, filter, flat map, map
            with index, batch, or on an ``IterDataset`` a packer).
    """
    from dataloader.dataset.base import IterDataset

    items = transformations if isinstance(transformations, Sequence) else [transformations]
    for i, op in enumerate(items):
        refuse_class(op, f"transformations[{i}]")
        runs = runs_of(op)
        if runs == GROUP:
            ds = ds._then(op) if isinstance(ds, IterDataset) else ds._batch(op)
        elif runs == ELEMENT:
            ds = _element_call(ds, op)
        elif runs == STREAM and isinstance(ds, IterDataset):
            from dataloader.dataset.transformations.packing import PackIterDataset

            ds = PackIterDataset(ds, op)
        else:
            raise TypeError(
                f"transformations[{i}] is {op!r}, which is not an operation for a "
                f"{type(ds).__name__} (map, random map, filter, flat map, map with index, "
                f"batch; packers on an IterDataset)"
            )
    return ds


class ShapeDtypeStruct(NamedTuple):
    """The shape and dtype of one leaf of an element (Grain's ``ShapeDtypeStruct``); a
    dimension that differs between elements (a kept remainder's batch) is None."""

    shape: tuple[int | None, ...]
    dtype: np.dtype


def _spec(tree: Any, batch_unknown: bool) -> Any:
    if isinstance(tree, dict):
        return {k: _spec(v, batch_unknown) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)) and not hasattr(tree, "_fields"):
        return type(tree)(_spec(v, batch_unknown) for v in tree)
    if isinstance(tree, tuple):  # a named tuple
        return type(tree)(*(_spec(v, batch_unknown) for v in tree))
    array = np.asarray(tree)
    shape: tuple[int | None, ...] = array.shape
    if batch_unknown and shape:
        shape = (None, *shape[1:])
    return ShapeDtypeStruct(shape, array.dtype)


def get_element_spec(ds: Any) -> Any:
    """The structure of ``ds``'s elements: a tree of :class:`ShapeDtypeStruct`.

    Grain infers it without reading data where its transformations can; here it is read
    off the first element (``ds[0]`` for a ``MapDataset``, the first ``next()`` of a new
    iterator for an ``IterDataset``), which computes that one element. Where the last
    step is a batch that keeps a shorter last batch (``drop_remainder=False``, default
    stacking), each leaf's leading dimension is None, as in Grain, whatever the length.

    Raises:
        ValueError: the dataset has no element.
    """
    from dataloader.dataset.base import IterDataset
    from dataloader.dataset.map_dataset import MapDataset

    batch = ds.batched_by if isinstance(ds, (MapDataset, IterDataset)) else None
    unknown = batch is not None and batch.last_may_be_short
    if isinstance(ds, MapDataset):
        for element in ds:
            return _spec(element, unknown)
        raise ValueError(f"{ds!r} has no element to read a spec from")
    it = iter(ds)
    try:
        return _spec(next(it), unknown)
    except StopIteration:
        raise ValueError(f"{ds!r} has no element to read a spec from") from None
    finally:
        if hasattr(it, "close"):
            it.close()


def get_next_index(ds_iter: Any) -> int:
    """The index of the element ``ds_iter`` hands out next (Grain's ``get_next_index``).

    Raises:
        ValueError: the iterator cannot tell without processing (a filter, a flat map, a
            packer, ...).
    """
    return ds_iter._get_next_index()


def set_next_index(ds_iter: Any, index: int) -> None:
    """Moves ``ds_iter`` so that it hands out element ``index`` next, without processing
    the elements before it (Grain's ``set_next_index``).

    Raises:
        ValueError: ``index`` is not a non-negative integer, or the iterator cannot move
            without processing.
    """
    if isinstance(index, (bool, np.bool_)) or not isinstance(index, (int, np.integer)) or index < 0:
        raise ValueError(f"set_next_index needs a non-negative integer index, got {index!r}")
    ds_iter._set_next_index(int(index))
