"""Bucketing by length: batches of elements of similar length, padded (tf.data's
``bucket_by_sequence_length``).

Each element's length (``element_length_func(element)``, or the length of one feature)
picks a bucket: with boundaries ``[b0, b1, ...]`` bucket 0 holds lengths ``< b0``, bucket
1 lengths in ``[b0, b1)``, ..., the last bucket lengths ``>= b[-1]``. A bucket that holds
its batch size of elements becomes a batch at once: every array of the elements is
padded along each axis to the longest in the batch (or, with ``pad_to_bucket_boundary``,
the first axis to ``boundary - 1``) and stacked. When the stream ends, the buckets that
are not empty become the last batches, in bucket order (none with ``drop_remainder``).

It runs on the ordered stream, in the consumer's process (``runs = "stream"``), so its
batches are a function of the stream alone, whatever the worker count; the stage that
runs it (``dataloader.engine.stages.bucket``) resumes from a small state.

Example:
    >>> op = BucketByLength(len, bucket_boundaries=[3], bucket_batch_sizes=[2, 1])
    >>> op.bucket_of([1, 2]), op.bucket_of([1, 2, 3])
    (0, 1)
    >>> op.batch_fn(0, [np.array([1]), np.array([2, 3])]).tolist()
    [[1, 0], [2, 3]]
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .batch import stack_elements


def _positive_ints(name: str, values: Any, hint: str) -> list[int]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{name} must be a list of integers, got {values!r}; {hint}")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name} must hold positive integers, got {v!r} in {list(values)!r}; {hint}")
        out.append(int(v))
    return out


class BucketByLength:
    """Batches elements of similar length together, padding each batch (see the module
    docstring).

    Args:
        element_length_func: ``f(element) -> int``, or the key of the feature whose
            first axis is the length (elements are dicts); a YAML config gives the key.
        bucket_boundaries: increasing positive integers: the upper bounds (exclusive)
            of every bucket but the last.
        bucket_batch_sizes: the batch size of each bucket, one more than the boundaries.
        padding_values: the value of padding cells: a scalar, or a dict of top-level
            key to scalar (default 0).
        pad_to_bucket_boundary: pad the first axis to the bucket's boundary minus one
            (static shapes per bucket) rather than to the longest in the batch; elements
            of the last bucket then pad to the longest as before.
        drop_remainder: drop the buckets that are not full when the stream ends.

    Raises:
        TypeError, ValueError: at construction, naming the argument and the value.
    """

    runs = "stream"  # on the ordered stream: operations.transforms.STREAM
    stage = "dataloader.engine.stages.bucket:BucketIterator"  # the stage that runs it
    config_key = "bucket_by_length"  # its key in a YAML config's operations

    def __init__(
        self,
        element_length_func: Callable[[Any], int] | str,
        bucket_boundaries: Sequence[int],
        bucket_batch_sizes: Sequence[int],
        *,
        padding_values: Any = 0,
        pad_to_bucket_boundary: bool = False,
        drop_remainder: bool = False,
    ) -> None:
        if not callable(element_length_func) and not isinstance(element_length_func, str):
            raise TypeError(
                f"element_length_func must be a function of the element or a feature's key, "
                f"got {element_length_func!r}"
            )
        self.boundaries = _positive_ints(
            "bucket_boundaries", bucket_boundaries, "pass the increasing upper bounds of the buckets"
        )
        if any(a >= b for a, b in zip(self.boundaries, self.boundaries[1:])):
            raise ValueError(f"bucket_boundaries must increase, got {self.boundaries}; sort them")
        self.batch_sizes = _positive_ints(
            "bucket_batch_sizes", bucket_batch_sizes, "pass one batch size per bucket"
        )
        if len(self.batch_sizes) != len(self.boundaries) + 1:
            raise ValueError(
                f"bucket_batch_sizes needs one size per bucket: {len(self.boundaries) + 1} for "
                f"{len(self.boundaries)} boundaries, got {len(self.batch_sizes)} ({self.batch_sizes})"
            )
        for name, flag in (("pad_to_bucket_boundary", pad_to_bucket_boundary), ("drop_remainder", drop_remainder)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be True or False, got {flag!r}")
        self._length = element_length_func
        self.padding_values = padding_values
        self.pad_to_bucket_boundary = pad_to_bucket_boundary
        self.drop_remainder = drop_remainder

    def bucket_of(self, element: Any) -> int:
        """The bucket of ``element``, from its length."""
        if isinstance(self._length, str):
            length = len(element[self._length])
        else:
            length = self._length(element)
        if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 0:
            raise ValueError(
                f"{self.name}: the element's length must be a non-negative integer, got "
                f"{length!r}; make element_length_func return one"
            )
        return bisect.bisect_right(self.boundaries, int(length))

    def batch_fn(self, bucket: int, elements: list[Any]) -> Any:
        """The elements of ``bucket``, padded and stacked into one batch."""
        first_axis = None
        if self.pad_to_bucket_boundary and bucket < len(self.boundaries):
            first_axis = self.boundaries[bucket] - 1
        return stack_elements(_padded(elements, self.padding_values, first_axis))

    def describe(self) -> dict[str, Any]:
        """What a state of its stage records, to refuse a state of another bucketing."""
        return {
            "boundaries": self.boundaries,
            "batch_sizes": self.batch_sizes,
            "pad_to_bucket_boundary": self.pad_to_bucket_boundary,
            "drop_remainder": self.drop_remainder,
        }

    @property
    def name(self) -> str:
        return f"BucketByLength(boundaries={self.boundaries}, batch_sizes={self.batch_sizes})"

    def __repr__(self) -> str:
        return self.name


def _padded(elements: list[Any], padding: Any, first_axis: int | None) -> list[Any]:
    """The elements with every array padded to one shape (per leaf, across elements)."""
    first = elements[0]
    if isinstance(first, dict):
        out: list[dict[Any, Any]] = [dict(e) for e in elements]
        for key in first:
            value = padding.get(key, 0) if isinstance(padding, dict) else padding
            for e, leaf in zip(out, _pad_leaves([e[key] for e in elements], value, first_axis)):
                e[key] = leaf
        return out
    return _pad_leaves(elements, padding, first_axis)


def _pad_leaves(leaves: list[Any], value: Any, first_axis: int | None) -> list[Any]:
    if not isinstance(leaves[0], np.ndarray) or leaves[0].ndim == 0:
        return leaves  # scalars and the like: stacked as they are
    shape = list(np.max([np.shape(leaf) for leaf in leaves], axis=0))
    if first_axis is not None:
        if shape[0] > first_axis:
            raise ValueError(
                f"an element of length {shape[0]} does not fit its bucket's boundary "
                f"({first_axis} + 1); check that element_length_func measures the padded axis"
            )
        shape[0] = first_axis
    return [
        np.pad(leaf, [(0, s - n) for s, n in zip(shape, leaf.shape)], constant_values=value)
        if list(leaf.shape) != shape else leaf
        for leaf in leaves
    ]
