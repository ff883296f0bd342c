"""Tests for index checking and the part index shared by file-backed sources."""

from __future__ import annotations

import re

import numpy as np
import pytest

from dataloader.sources._indexing import PartIndex, as_index_array, as_index_list, check_index


def test_check_index_accepts_numpy_integers():
    assert check_index(np.uint8(3), 4) == 3
    assert type(check_index(np.int64(3), 4)) is int


@pytest.mark.parametrize("bad", [1.0, "1", True, None])
def test_check_index_rejects_non_integers(bad):
    with pytest.raises(TypeError, match="record index must be an integer, got"):
        check_index(bad, 4)


def test_as_index_array_converts_lists_and_other_int_dtypes_to_int64():
    assert as_index_array([3, 1], 4).dtype == np.int64
    assert as_index_array(np.array([3, 1], dtype=np.uint16), 4).tolist() == [3, 1]


def test_as_index_array_rejects_two_dimensional_indices():
    with pytest.raises(ValueError, match=r"one-dimensional, got an array of shape \(2, 1\)"):
        as_index_array(np.zeros((2, 1), dtype=np.int64), 4)


def test_as_index_array_rejects_float_indices():
    with pytest.raises(TypeError, match=r"must be integers, got float 0\.5"):
        as_index_array([1, 0.5], 4)


def test_as_index_array_rejects_negative_indices():
    with pytest.raises(IndexError, match=r"index -2 is out of range for a source of length 4"):
        as_index_array(np.array([0, -2]), 4)


@pytest.mark.parametrize("indices", [[3, 0, 3], np.array([3, 0, 3]), np.array([3, 0, 3], np.uint8), (3, 0, 3),
                                     [np.int64(3), 0, 3]])
def test_as_index_list_gives_python_ints_whatever_the_input(indices):
    out = as_index_list(indices, 4)
    assert out == [3, 0, 3] and all(type(i) is int for i in out)


@pytest.mark.parametrize("bad", [[0, 4], np.array([0, -1]), [True], [0.5], np.array([[0]])])
def test_as_index_list_refuses_what_as_index_array_refuses_with_the_same_message(bad):
    with pytest.raises((IndexError, TypeError, ValueError)) as expected:
        as_index_array(bad, 4)
    with pytest.raises(type(expected.value), match=re.escape(str(expected.value))):
        as_index_list(bad, 4)


def test_part_index_maps_across_parts_and_skips_empty_parts():
    index = PartIndex([3, 0, 2, 1])
    assert index.total == 6
    expected = [(0, 0), (0, 1), (0, 2), (2, 0), (2, 1), (3, 0)]
    assert [index.locate(i) for i in range(6)] == expected
    parts, local = index.locate_many(np.arange(6))
    assert list(zip(parts.tolist(), local.tolist(), strict=True)) == expected
