"""Index validation and the mapping from a global index to (part, local index).

Every source in this package accepts Python integers and numpy integers alike
(the loader hands over int64 arrays) and refuses anything else with a message
that names the value. Indices must lie in ``[0, len(source))``: a negative
index is an error rather than a count from the end, because in a data loader
``-1`` is almost always an arithmetic bug upstream, not a request for the last
record.

A source made of several parts (files, or row groups of files) maps a global
index to a part with the cumulative record counts and ``numpy.searchsorted``.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Sequence
from typing import SupportsIndex

import numpy as np


def check_index(index: SupportsIndex, length: int) -> int:
    """Returns ``index`` as a Python int after checking its type and range.

    Args:
        index: A Python or numpy integer.
        length: The number of records of the source.

    Raises:
        TypeError: ``index`` is not an integer.
        IndexError: ``index`` is outside ``[0, length)``.
    """
    try:
        if isinstance(index, bool):
            raise TypeError
        i = operator.index(index)
    except TypeError:
        raise TypeError(
            f"record index must be an integer, got {type(index).__name__} {index!r}; "
            "pass an int or a numpy integer"
        ) from None
    if not 0 <= i < length:
        raise IndexError(
            f"record index {i} is out of range for a source of length {length}; "
            f"valid indices are 0 to {length - 1}"
        )
    return i


def as_index_array(indices: Sequence[int] | np.ndarray, length: int) -> np.ndarray:
    """Returns ``indices`` as a checked 1-D int64 array.

    Args:
        indices: A sequence of Python/numpy integers or a 1-D integer array.
        length: The number of records of the source.

    Raises:
        TypeError: An element is not an integer.
        ValueError: ``indices`` is not one-dimensional.
        IndexError: An index is outside ``[0, length)``; the first one is named.
    """
    array = np.asarray(indices)
    if array.size == 0:
        return np.zeros(0, dtype=np.int64)
    if array.ndim != 1:
        raise ValueError(
            f"indices must be one-dimensional, got an array of shape {array.shape}; "
            "pass a flat list or a 1-D array"
        )
    if array.dtype.kind not in "iu":
        elements = array.tolist() if isinstance(indices, np.ndarray) else indices
        bad = next(
            (x for x in elements if isinstance(x, bool) or not hasattr(x, "__index__")),
            elements[0],
        )
        raise TypeError(
            f"record indices must be integers, got {type(bad).__name__} {bad!r} "
            f"(array dtype {array.dtype}); pass ints or a numpy integer array"
        )
    if array.dtype != np.int64:
        array = array.astype(np.int64)
    out_of_range = (array < 0) | (array >= length)
    if out_of_range.any():
        bad_index = int(array[np.argmax(out_of_range)])
        raise IndexError(
            f"record index {bad_index} is out of range for a source of length {length}; "
            f"valid indices are 0 to {length - 1}"
        )
    return array


def as_index_list(indices: Sequence[int] | np.ndarray, length: int) -> list[int]:
    """Returns ``indices`` as a checked list of Python ints (the errors of
    :func:`as_index_array`).

    The fast path of a read that goes on record by record anyway: a 1-D integer array
    or a list of ints is checked with Python's ``min`` and ``max`` over its list, which for
    the few records a mixture asks of each source costs a fraction of a microsecond
    where numpy's checks cost several.
    """
    if isinstance(indices, np.ndarray) and indices.ndim == 1 and indices.dtype.kind in "iu":
        values = indices.tolist()
    elif isinstance(indices, list) and all(type(i) is int for i in indices):
        values = indices
    else:
        return as_index_array(indices, length).tolist()
    if values and (min(values) < 0 or max(values) >= length):
        as_index_array(indices, length)  # raises, naming the first bad index
    return values


class PartIndex:
    """Maps global record indices onto parts of known sizes.

    Part ``k`` holds the global indices ``[offsets[k], offsets[k + 1])``. Parts
    may be empty; an index always maps to the non-empty part that holds it.

    Example:
        >>> index = PartIndex([3, 0, 2])
        >>> index.locate(3)
        (2, 0)
    """

    def __init__(self, counts: Sequence[int]) -> None:
        self.counts = np.asarray(counts, dtype=np.int64)
        self.offsets = np.zeros(len(self.counts) + 1, dtype=np.int64)
        np.cumsum(self.counts, out=self.offsets[1:])
        self.total = int(self.offsets[-1])
        # bisect on a list beats numpy on one scalar by about a microsecond.
        self._offset_list = self.offsets.tolist()

    def locate(self, index: int) -> tuple[int, int]:
        """Returns (part, index within the part) for one checked index."""
        part = bisect.bisect_right(self._offset_list, index) - 1
        return part, index - self._offset_list[part]

    def locate_many(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Returns the parts and local indices of a checked int64 array."""
        parts = np.searchsorted(self.offsets, indices, side="right") - 1
        return parts, indices - self.offsets[parts]
