"""Batching: ``Batch`` and the default stacking of nested elements.

The default ``batch_fn`` stacks elements that share one structure of nested dicts,
tuples (named tuples included) and lists, whose leaves are numpy arrays or scalars:

* numpy arrays of one shape are stacked along a new leading axis;
* Python and numpy scalars become a 1-D array (``bool``, ``int``, ``float`` keep their kind);
* ``bytes`` and ``str`` become a 1-D ``object`` array, because fixed-width byte
  strings would silently drop trailing zero bytes.

Example:
    >>> b = Batch(batch_size=2)
    >>> out = b.batch_fn([{"x": np.zeros(3), "y": 1}, {"x": np.ones(3), "y": 2}])
    >>> out["x"].shape, out["y"].tolist()
    ((2, 3), [1, 2])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .transforms import GROUP

_SCALARS = (bool, int, float, complex, np.generic)

# What to do about elements of different shapes: the operations that pad or pack them.
_RAGGED_HINT = (
    "for sequences of different lengths, batch with dl.BucketByLength instead (batches of "
    "similar lengths, each padded to its longest; ds.bucket_by_length(...)) or pack them "
    "into fixed-length rows before the Batch with dl.FirstFitPack, dl.BestFitPack or "
    "dl.ConcatThenSplit; else make the shapes equal in a map before the batch (resize, "
    "crop or pad) or pass Batch(batch_fn=...)"
)


def _path_str(path: tuple[Any, ...]) -> str:
    return "".join(f"[{p!r}]" for p in path) or "<element>"


def _stack_leaf(values: list[Any], path: tuple[Any, ...]) -> np.ndarray:
    first = values[0]
    if isinstance(first, np.ndarray):
        shape = first.shape
        for i, v in enumerate(values):
            if not isinstance(v, np.ndarray) or v.shape != shape:
                got = v.shape if isinstance(v, np.ndarray) else type(v).__name__
                raise ValueError(
                    f"Batch cannot stack field {_path_str(path)}: element 0 has shape {shape} "
                    f"but element {i} has {got}; {_RAGGED_HINT}"
                )
        return np.stack(values)
    if isinstance(first, (bytes, str)):
        out = np.empty(len(values), dtype=object)
        out[:] = values
        return out
    if isinstance(first, _SCALARS):
        arr = np.asarray(values)
        if arr.dtype.kind not in "biufc" or arr.ndim != 1:
            raise ValueError(
                f"Batch cannot stack field {_path_str(path)}: it mixes scalars with other "
                f"types ({sorted({type(v).__name__ for v in values})}); return one type per "
                f"field or pass Batch(batch_fn=...)"
            )
        return arr
    raise TypeError(
        f"Batch cannot stack field {_path_str(path)} of type {type(first).__name__}; "
        f"return numpy arrays, scalars, bytes or str (in dicts, tuples or lists), or pass "
        f"Batch(batch_fn=...)"
    )


def _stack(values: list[Any], path: tuple[Any, ...]) -> Any:
    first = values[0]
    if isinstance(first, dict):
        keys = first.keys()
        for i, v in enumerate(values):
            if not isinstance(v, dict) or v.keys() != keys:
                got = sorted(v.keys()) if isinstance(v, dict) else type(v).__name__
                raise ValueError(
                    f"Batch cannot stack field {_path_str(path)}: element 0 has keys "
                    f"{sorted(keys)} but element {i} has {got}; give every element the same keys"
                )
        return {k: _stack([v[k] for v in values], (*path, k)) for k in keys}
    if isinstance(first, (tuple, list)):
        n = len(first)
        for i, v in enumerate(values):
            if type(v) is not type(first) or len(v) != n:
                raise ValueError(
                    f"Batch cannot stack field {_path_str(path)}: element 0 is a "
                    f"{type(first).__name__} of length {n} but element {i} is a "
                    f"{type(v).__name__} of length {len(v) if hasattr(v, '__len__') else '?'}"
                )
        parts = [_stack([v[j] for v in values], (*path, j)) for j in range(n)]
        if isinstance(first, tuple) and hasattr(first, "_fields"):
            return type(first)(*parts)
        return type(first)(parts)
    return _stack_leaf(values, path)


def stack_elements(elements: Sequence[Any]) -> Any:
    """Stacks a non-empty sequence of same-structured elements into one batch."""
    if not elements:
        raise ValueError("cannot batch an empty list of elements")
    return _stack(list(elements), ())


class Batch:
    """Groups consecutive elements into batches of ``batch_size``.

    Args:
        batch_size: elements per batch, a positive integer. With sharding this is the
            per-host batch.
        drop_remainder: drop the last batch of the stream when it is smaller than
            ``batch_size`` (so every batch has a static shape).
        batch_fn: ``f(list_of_elements) -> batch``; defaults to :func:`stack_elements`.
    """

    runs = GROUP  # on consecutive elements (see operations.transforms)

    def __init__(
        self,
        batch_size: int,
        drop_remainder: bool = False,
        batch_fn: Callable[[list[Any]], Any] | None = None,
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)):
            raise TypeError(f"batch_size must be an integer, got {batch_size!r}")
        if batch_size <= 0:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size}")
        # A string such as "no" is truthy: refuse it rather than read it as True.
        if not isinstance(drop_remainder, bool):
            raise TypeError(
                f"drop_remainder must be True or False, got {drop_remainder!r} of type "
                f"{type(drop_remainder).__name__}"
            )
        if batch_fn is not None and not callable(batch_fn):
            raise TypeError(
                f"batch_fn must be a callable taking a list of elements, got {batch_fn!r}"
            )
        self.batch_size = int(batch_size)
        self.drop_remainder = bool(drop_remainder)
        self._batch_fn = batch_fn

    def keeps(self, count: int) -> bool:
        """Whether ``count`` elements (the last of a stream, ``count <= batch_size``) make a
        batch: the drop-remainder rule, written once."""
        return count > 0 and (count == self.batch_size or not self.drop_remainder)

    @property
    def last_may_be_short(self) -> bool:
        """Whether the stream's last batch may have fewer than ``batch_size`` rows (the
        remainder kept, stacked by the default ``batch_fn``): an element spec then gives
        ``None`` for the leading dimension, as Grain's does. False with
        ``drop_remainder``; False with a ``batch_fn`` of your own, whose output shape the
        spec reads off the first batch."""
        return not self.drop_remainder and self._batch_fn is None

    def batches_in(self, count: int) -> int:
        """How many batches ``count`` elements make."""
        full, rest = divmod(count, self.batch_size)
        return full + int(self.keeps(rest))

    def batch_fn(self, elements: list[Any]) -> Any:
        """Turns a list of elements into one batch."""
        if self._batch_fn is None:
            return stack_elements(elements)
        return self._batch_fn(elements)

    @property
    def name(self) -> str:
        fn = "" if self._batch_fn is None else f", batch_fn={getattr(self._batch_fn, '__qualname__', '?')}"
        return f"Batch({self.batch_size}, drop_remainder={self.drop_remainder}{fn})"

    def __repr__(self) -> str:
        return self.name
