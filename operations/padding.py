"""Batching that pads a short batch to full size (and says which rows are padding).

With ``drop_remainder=False`` the last batch of a finite stream is usually short, and
a jitted training step would recompile for its shape. Dropping it loses data; padding
it keeps every batch the same shape.

:func:`batch_and_pad` is Grain's function (``batch_and_pad(values, *, batch_size,
pad_value=0)``, a ``batch_fn``): the stacked batch padded with ``pad_value``, nothing
else. :func:`batch_and_pad_with_mask` (used by :class:`BatchAndPad` and
``ds.batch_and_pad(n)``) also says which rows are real. It stacks the elements as
:func:`~operations.batch.stack_elements` does, appends rows filled with a pad value up
to ``batch_size``, and adds a boolean mask, ``True`` for the real rows, so a loss or
metric can ignore the padding:

* dict elements get the mask as one more key (``mask_key``, default ``"mask"``);
* any other element structure becomes the pair ``(batch, mask)``.

Every batch carries the mask, full or not, so the structure never changes mid-stream.

Example:
    >>> batch_and_pad([np.int64(1), np.int64(2)], batch_size=3, pad_value=-1).tolist()
    [1, 2, -1]
    >>> out = batch_and_pad_with_mask([{"x": np.ones(2)}, {"x": np.ones(2)}], batch_size=3)
    >>> out["x"].tolist(), out["mask"].tolist()
    ([[1.0, 1.0], [1.0, 1.0], [0.0, 0.0]], [True, True, False])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .batch import Batch, stack_elements


def _pad_leaf(leaf: np.ndarray, rows: int, value: Any, path: str) -> np.ndarray:
    if rows == 0:
        return leaf
    if leaf.dtype == object:  # bytes/str leaves: pad with an empty value of the same kind
        fill = value if not isinstance(value, (int, float)) else type(leaf[0])()
        pad = np.empty(rows, dtype=object)
        pad[:] = [fill] * rows
        return np.concatenate([leaf, pad])
    try:
        pad = np.full((rows, *leaf.shape[1:]), value, dtype=leaf.dtype)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValueError(
            f"batch_and_pad cannot fill field {path} (dtype {leaf.dtype}) with pad value "
            f"{value!r}: {exc}; pass a pad_value that fits, e.g. pad_value={{'{path}': 0}}"
        ) from exc
    return np.concatenate([leaf, pad])


def _pad_tree(tree: Any, rows: int, pad_value: Any, path: str) -> Any:
    if isinstance(tree, dict):
        out = {}
        for key, sub in tree.items():
            value = pad_value.get(key, 0) if isinstance(pad_value, Mapping) else pad_value
            out[key] = _pad_tree(sub, rows, value, f"{path}[{key!r}]")
        return out
    if isinstance(tree, (tuple, list)):
        parts = [_pad_tree(sub, rows, pad_value, f"{path}[{i}]") for i, sub in enumerate(tree)]
        if isinstance(tree, tuple) and hasattr(tree, "_fields"):
            return type(tree)(*parts)
        return type(tree)(parts)
    if isinstance(pad_value, Mapping):
        raise ValueError(
            f"pad_value is a dict but field {path or '<element>'} is not inside a dict; "
            f"pass one scalar pad_value for elements that are not dicts"
        )
    return _pad_leaf(np.asarray(tree), rows, pad_value, path or "<element>")


def batch_and_pad(values: Sequence[Any], *, batch_size: int, pad_value: Any = 0) -> Any:
    """Grain's ``batch_and_pad``: stacks ``values`` and pads the batch to ``batch_size`` rows.

    Usable as ``batch_fn``: ``ds.batch(n, batch_fn=functools.partial(batch_and_pad,
    batch_size=n))``. Every leaf gets ``batch_size - len(values)`` rows of ``pad_value``
    (a scalar, or for dict elements a dict of top-level key to scalar).

    Raises:
        ValueError: no values, more values than ``batch_size``, or a pad value a leaf
            cannot hold.
    """
    n = len(values)
    if not 1 <= n <= batch_size:
        raise ValueError(
            f"batch_and_pad got {n} values for batch_size={batch_size}; pass between 1 "
            f"and {batch_size} values"
        )
    return _pad_tree(stack_elements(values), batch_size - n, pad_value, "")


def batch_and_pad_with_mask(
    elements: Sequence[Any],
    batch_size: int,
    *,
    pad_value: Any = 0,
    mask_key: str = "mask",
) -> Any:
    """Stacks ``elements`` and pads the result to ``batch_size`` rows, with a mask.

    Args:
        elements: one to ``batch_size`` elements of the same structure.
        batch_size: the number of rows of every output.
        pad_value: the value of padding rows; a scalar, or for dict elements a dict
            from top-level key to scalar (missing keys pad with 0). ``bytes``/``str``
            fields pad with empty values.
        mask_key: the key of the mask when elements are dicts.

    Returns:
        For dict elements, the stacked dict plus ``mask_key``: a ``bool`` array of
        shape ``(batch_size,)``, ``True`` for real rows. Otherwise ``(batch, mask)``.

    Raises:
        ValueError: more elements than ``batch_size``, none at all, a dict element
            that already has ``mask_key``, or a pad value the field cannot hold.
    """
    n = len(elements)
    if not 1 <= n <= batch_size:
        raise ValueError(
            f"batch_and_pad_with_mask got {n} elements for batch_size={batch_size}; it pads up to "
            f"the batch size, so pass between 1 and {batch_size} elements"
        )
    batch = _pad_tree(stack_elements(elements), batch_size - n, pad_value, "")
    mask = np.zeros(batch_size, dtype=bool)
    mask[:n] = True
    if isinstance(batch, dict):
        if mask_key in batch:
            raise ValueError(
                f"elements already have a field {mask_key!r}; pass another "
                f"mask_key=... to batch_and_pad_with_mask"
            )
        batch[mask_key] = mask
        return batch
    return batch, mask


class BatchAndPad(Batch):
    """A :class:`~operations.Batch` whose every batch has ``batch_size`` rows and a mask.

    Use it wherever a ``Batch`` goes (``DataLoader`` operations, or
    ``ds.batch_and_pad(...)`` in the dataset API). Nothing is dropped: the last, short
    batch is padded (see :func:`batch_and_pad_with_mask`).

    Args:
        batch_size: rows per batch, a positive integer.
        pad_value: the value of padding rows (scalar, or dict of top-level key to scalar).
        mask_key: the key of the mask when elements are dicts.

    Example:
        >>> op = BatchAndPad(4, pad_value=-1)
        >>> batch, mask = op.batch_fn([np.int64(5), np.int64(6)])
        >>> batch.tolist(), mask.tolist()
        ([5, 6, -1, -1], [True, True, False, False])
    """

    def __init__(self, batch_size: int, *, pad_value: Any = 0, mask_key: str = "mask") -> None:
        super().__init__(batch_size, drop_remainder=False)
        if not isinstance(mask_key, str) or not mask_key:
            raise TypeError(f"mask_key must be a non-empty str, got {mask_key!r}")
        self.pad_value = pad_value
        self.mask_key = mask_key

    @property
    def last_may_be_short(self) -> bool:
        """Never: the last batch is padded to ``batch_size`` rows."""
        return False

    def batch_fn(self, elements: list[Any]) -> Any:
        return batch_and_pad_with_mask(
            elements, self.batch_size, pad_value=self.pad_value, mask_key=self.mask_key
        )

    @property
    def name(self) -> str:
        return f"BatchAndPad({self.batch_size}, pad_value={self.pad_value!r})"
