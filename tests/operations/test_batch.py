"""Batch stacks nested elements and names the field when it cannot."""

from __future__ import annotations

import collections
import re

import numpy as np
import pytest

from dataloader.operations import Batch, stack_elements


def test_stacks_arrays_along_a_new_axis():
    out = stack_elements([np.full((2, 3), i) for i in range(4)])
    assert out.shape == (4, 2, 3) and out[3, 1, 2] == 3


def test_stacks_nested_dicts_tuples_and_lists():
    elems = [{"a": (np.zeros(2) + i, [i, float(i)]), "b": {"c": np.int32(i)}} for i in range(3)]
    out = stack_elements(elems)
    assert out["a"][0].shape == (3, 2)
    assert out["a"][1][0].tolist() == [0, 1, 2] and out["a"][1][1].dtype == np.float64
    assert out["b"]["c"].dtype == np.int32


def test_named_tuples_keep_their_type():
    Point = collections.namedtuple("Point", "x y")
    out = stack_elements([Point(1, 2.0), Point(3, 4.0)])
    assert isinstance(out, Point) and out.x.tolist() == [1, 3]


def test_bytes_and_strings_become_object_arrays_without_losing_zero_bytes():
    out = stack_elements([b"a\x00", b"bc"])
    assert out.dtype == object and out.tolist() == [b"a\x00", b"bc"]


def test_mismatched_shapes_name_the_field_and_shapes():
    with pytest.raises(ValueError, match=r"field \['x'\]\[1\]: element 0 has shape \(2,\) but element 2 has \(3,\)"):
        stack_elements([{"x": (0, np.zeros(2))}, {"x": (0, np.zeros(2))}, {"x": (0, np.zeros(3))}])


def test_a_ragged_batch_names_the_operations_that_pad_or_pack():
    ragged = [{"tokens": np.arange(3)}, {"tokens": np.arange(5)}]
    with pytest.raises(ValueError, match=(
        r"field \['tokens'\]: element 0 has shape \(3,\) but element 1 has \(5,\); for sequences "
        r"of different lengths, batch with dl\.BucketByLength .*ds\.bucket_by_length.* "
        r"dl\.FirstFitPack, dl\.BestFitPack or dl\.ConcatThenSplit"
    )):
        Batch(2).batch_fn(ragged)


def test_mismatched_keys_are_named():
    with pytest.raises(ValueError, match=r"element 0 has keys \['a'\] but element 1 has \['b'\]"):
        stack_elements([{"a": 1}, {"b": 1}])


def test_mixed_scalar_types_are_refused():
    with pytest.raises(ValueError, match=r"field <element>: it mixes scalars with other types"):
        stack_elements([1, "a"])


def test_unknown_leaf_types_are_refused():
    with pytest.raises(TypeError, match=r"cannot stack field \['f'\] of type object"):
        stack_elements([{"f": object()}, {"f": object()}])


@pytest.mark.parametrize("size", [0, -3])
def test_non_positive_batch_size_is_refused(size):
    with pytest.raises(ValueError, match=rf"batch_size must be a positive integer, got {size}"):
        Batch(size)


def test_non_integer_batch_size_is_refused():
    with pytest.raises(TypeError, match=r"batch_size must be an integer, got 2.0"):
        Batch(2.0)


def test_custom_batch_fn_is_used():
    b = Batch(2, batch_fn=lambda xs: sum(xs))
    assert b.batch_fn([1, 2]) == 3


@pytest.mark.parametrize("value", ["no", 1, None, "False"])
def test_drop_remainder_that_is_not_a_bool_is_refused(value):
    with pytest.raises(TypeError, match=rf"drop_remainder must be True or False, got {re.escape(repr(value))} of type"):
        Batch(10, drop_remainder=value)


def test_non_callable_batch_fn_is_refused():
    with pytest.raises(TypeError, match=r"batch_fn must be a callable"):
        Batch(2, batch_fn=5)


@pytest.mark.parametrize(
    ("drop", "count", "keeps", "batches"),
    [(False, 0, False, 0), (False, 3, True, 1), (True, 3, False, 0), (True, 4, True, 1)],
)
def test_drop_remainder_rule(drop, count, keeps, batches):
    """A last group becomes a batch when it is full, or when remainders are kept."""
    batch = Batch(4, drop_remainder=drop)
    assert batch.keeps(count) is keeps
    assert batch.batches_in(count + 8) == batches + 2
