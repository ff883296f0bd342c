"""BucketByLength: which bucket an element goes to, how a bucket's batch is padded, and
the arguments it refuses at construction."""

from __future__ import annotations

import numpy as np
import pytest

from dataloader.operations import BucketByLength


def test_boundaries_are_exclusive_upper_bounds_and_the_last_bucket_is_open():
    op = BucketByLength(len, [3, 6], [2, 2, 2])
    assert [op.bucket_of([0] * n) for n in (0, 2, 3, 5, 6, 100)] == [0, 0, 1, 1, 2, 2]


def test_a_feature_key_measures_that_features_first_axis():
    op = BucketByLength("tokens", [4], [1, 1])
    assert op.bucket_of({"tokens": np.zeros(3)}) == 0
    assert op.bucket_of({"tokens": np.zeros(4)}) == 1


def test_a_batch_pads_every_array_to_the_longest_with_per_key_values():
    op = BucketByLength("tokens", [8], [2, 2], padding_values={"tokens": -1})
    batch = op.batch_fn(0, [
        {"tokens": np.array([1, 2, 3]), "mask": np.array([1, 1, 1]), "id": 7},
        {"tokens": np.array([4]), "mask": np.array([1]), "id": 8},
    ])
    assert batch["tokens"].tolist() == [[1, 2, 3], [4, -1, -1]]
    assert batch["mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["id"].tolist() == [7, 8]


def test_pad_to_bucket_boundary_gives_each_bucket_one_shape():
    op = BucketByLength(len, [4, 8], [2, 2, 2], pad_to_bucket_boundary=True)
    assert op.batch_fn(1, [np.arange(4), np.arange(5)]).shape == (2, 7)
    assert op.batch_fn(2, [np.arange(9), np.arange(8)]).shape == (2, 9)  # the open bucket


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        (([3, 3], [1, 1, 1]), ValueError, r"bucket_boundaries must increase, got \[3, 3\]"),
        (([3], [1]), ValueError, r"one size per bucket: 2 for 1 boundaries, got 1"),
        (([0], [1, 1]), ValueError, r"bucket_boundaries must hold positive integers, got 0"),
        (([3], [1, 0]), ValueError, r"bucket_batch_sizes must hold positive integers, got 0"),
        (("3", [1, 1]), TypeError, r"bucket_boundaries must be a list of integers, got '3'"),
    ],
)
def test_bad_buckets_are_refused_at_construction(args, error, match):
    with pytest.raises(error, match=match):
        BucketByLength(len, *args)


def test_a_length_that_is_not_a_count_is_refused_naming_it():
    op = BucketByLength(lambda x: -1, [3], [1, 1])
    with pytest.raises(ValueError, match=r"length must be a non-negative integer, got -1"):
        op.bucket_of("x")


def test_it_declares_a_stream_operation_with_its_stage_and_yaml_key():
    assert BucketByLength.runs == "stream"
    assert BucketByLength.stage == "dataloader.engine.stages.bucket:BucketIterator"
    assert BucketByLength.config_key == "bucket_by_length"
