"""Tests of IndexSampler and SequentialSampler (samplers/index_sampler.py)."""

from __future__ import annotations

import json
import pickle
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dataloader.samplers import IndexSampler, NoSharding, SequentialSampler, ShardOptions, permute

FAST = settings(max_examples=60, deadline=None)


def _all_keys(sampler: IndexSampler) -> list[int]:
    return sampler.record_keys(np.arange(len(sampler))).tolist()


@FAST
@given(n=st.integers(1, 300), seed=st.integers(0, 2**63 - 1), num_epochs=st.integers(1, 4))
def test_each_epoch_is_a_permutation_of_the_records(n: int, seed: int, num_epochs: int) -> None:
    keys = _all_keys(IndexSampler(n, shuffle=True, num_epochs=num_epochs, seed=seed))
    assert len(keys) == n * num_epochs
    for epoch in range(num_epochs):
        assert sorted(keys[epoch * n : (epoch + 1) * n]) == list(range(n))


@FAST
@given(
    n=st.integers(1, 60),
    count=st.integers(1, 7),
    num_epochs=st.integers(1, 3),
    drop_remainder=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_shards_are_disjoint_and_cover_the_global_stream(
    n: int, count: int, num_epochs: int, drop_remainder: bool, seed: int
) -> None:
    whole = _all_keys(IndexSampler(n, shuffle=True, num_epochs=num_epochs, seed=seed))
    seen: dict[int, int] = {}
    for index in range(count):
        shard = IndexSampler(
            n,
            ShardOptions(index, count, drop_remainder),
            shuffle=True,
            num_epochs=num_epochs,
            seed=seed,
        )
        positions = shard.global_positions(np.arange(len(shard))).tolist()
        for position, key in zip(positions, _all_keys(shard), strict=True):
            assert position not in seen
            seen[position] = key
            assert whole[position] == key
    total = n * num_epochs
    covered = total - total % count if drop_remainder else total
    assert sorted(seen) == list(range(covered))


@FAST
@given(n=st.integers(1, 50), seed=st.integers(0, 1000), count=st.integers(1, 4), data=st.data())
def test_value_at_a_position_does_not_depend_on_query_order_or_batching(
    n: int, seed: int, count: int, data: st.DataObject
) -> None:
    sampler = IndexSampler(n, ShardOptions(count - 1, count), shuffle=True, seed=seed)
    positions = data.draw(st.lists(st.integers(0, 10 * n), min_size=1, max_size=40))
    together = sampler.record_keys(positions).tolist()
    one_by_one = [int(sampler.record_keys([p])[0]) for p in positions]
    backwards = sampler.record_keys(positions[::-1]).tolist()[::-1]
    by_item = [sampler[p].record_key for p in positions]
    assert together == one_by_one == backwards == by_item


@pytest.mark.parametrize("count", [1, 2, 4, 8])
def test_global_batch_is_the_same_whatever_the_shard_count(count: int) -> None:
    """With per-host batch B, global batch k is global positions [k*B*H, (k+1)*B*H)."""
    n, global_batch = 100, 16
    batch = global_batch // count
    whole = IndexSampler(n, shuffle=True, seed=1).record_keys(np.arange(1000))
    for k in range(20):
        positions = np.arange(k * batch, (k + 1) * batch)
        shards = [
            IndexSampler(n, ShardOptions(h, count), shuffle=True, seed=1) for h in range(count)
        ]
        got = np.concatenate([s.record_keys(positions) for s in shards])
        expected = whole[k * global_batch : (k + 1) * global_batch]
        assert sorted(got.tolist()) == sorted(expected.tolist())


def test_without_shuffle_records_come_in_order_epoch_after_epoch() -> None:
    sampler = IndexSampler(4, num_epochs=3)
    assert _all_keys(sampler) == [0, 1, 2, 3] * 3


def test_sharded_sequential_stream_is_interleaved() -> None:
    sampler = IndexSampler(5, ShardOptions(1, 3), num_epochs=3)
    assert _all_keys(sampler) == [1, 4, 2, 0, 3]  # global positions 1, 4, 7, 10, 13


def test_shuffled_stream_matches_the_permutation_of_each_epoch() -> None:
    n = 3
    keys = IndexSampler(n, shuffle=True, seed=12).record_keys(np.arange(900))
    expected = np.concatenate([permute(np.arange(n), n, seed=12, epoch=e) for e in range(300)])
    assert np.array_equal(keys, expected)


def test_positions_across_an_epoch_boundary_of_a_huge_data_set() -> None:
    n = 2**40
    sampler = IndexSampler(n, shuffle=True, seed=4)
    positions = np.arange(n - 500, n + 500)
    keys = sampler.record_keys(positions)
    assert np.array_equal(keys[:500], permute(np.arange(n - 500, n), n, seed=4, epoch=0))
    assert np.array_equal(keys[500:], permute(np.arange(500), n, seed=4, epoch=1))


def test_golden_stream_for_seed_42() -> None:
    """Pins positions 1000..1009 (epoch 1) of a shuffled stream of 1000 records."""
    sampler = IndexSampler(1000, shuffle=True, seed=42)
    expected = [758, 5, 241, 93, 683, 61, 206, 270, 427, 815]
    assert sampler.record_keys(np.arange(1000, 1010)).tolist() == expected


def test_finite_stream_length() -> None:
    sampler = IndexSampler(10, ShardOptions(1, 4), num_epochs=3)
    assert sampler.num_positions == len(sampler) == 8  # ceil((30 - 1) / 4)


def test_finite_stream_length_with_drop_remainder() -> None:
    sampler = IndexSampler(10, ShardOptions(1, 4, drop_remainder=True), num_epochs=3)
    assert sampler.num_positions == len(sampler) == 7


def test_infinite_stream_has_no_length() -> None:
    sampler = IndexSampler(10)
    assert sampler.num_positions is None
    assert len(sampler) == sys.maxsize


def test_infinite_stream_reaches_the_int64_limit() -> None:
    sampler = IndexSampler(7, ShardOptions(1, 2), shuffle=True, seed=0)
    last = (2**63 - 1 - 1) // 2
    assert 0 <= sampler[last].record_key < 7
    with pytest.raises(IndexError, match="its global position would not fit in int64"):
        sampler.record_keys([last + 1])


def test_getitem_describes_the_position() -> None:
    sampler = IndexSampler(10, ShardOptions(1, 2), shuffle=True, seed=3)
    meta = sampler[7]
    assert meta.index == 7
    assert meta.global_position == 15
    assert meta.epoch == 1
    assert meta.record_key == int(permute(np.array([5]), 10, seed=3, epoch=1)[0])
    assert meta.seed == 3


def test_getitem_past_the_end_is_refused() -> None:
    sampler = IndexSampler(10, num_epochs=1)
    with pytest.raises(
        IndexError, match="index 10 is out of range for a shard stream of length 10"
    ):
        sampler[10]


def test_getitem_of_a_negative_index_is_refused() -> None:
    with pytest.raises(IndexError, match="index -1 is negative"):
        IndexSampler(10)[-1]


def test_getitem_of_a_non_integer_is_refused() -> None:
    with pytest.raises(TypeError, match=r"index must be an int, got 1\.0 of type float"):
        IndexSampler(10)[1.0]  # type: ignore[index]


def test_record_keys_past_the_end_are_refused() -> None:
    sampler = IndexSampler(10, num_epochs=2)
    with pytest.raises(
        IndexError, match="position 20 is out of range for a shard stream of length 20; stop at len"
    ):
        sampler.record_keys([3, 20])


def test_negative_record_keys_positions_are_refused() -> None:
    with pytest.raises(IndexError, match="position -4 is negative"):
        IndexSampler(10).record_keys([-4, 1])


def test_float_positions_are_refused() -> None:
    with pytest.raises(
        TypeError, match="positions must be integers, got an array of dtype float64"
    ):
        IndexSampler(10).record_keys(np.array([1.0]))


def test_record_keys_of_no_positions_is_empty() -> None:
    keys = IndexSampler(10, shuffle=True, seed=0).record_keys(np.array([], dtype=np.int64))
    assert keys.shape == (0,)
    assert keys.dtype == np.int64


def test_record_keys_keep_the_shape_of_the_positions() -> None:
    keys = IndexSampler(10, shuffle=True, seed=0).record_keys(np.arange(30).reshape(3, 10))
    assert keys.shape == (3, 10)


def test_record_keys_never_return_the_callers_array() -> None:
    positions = np.arange(5)
    keys = IndexSampler(10).record_keys(positions)
    keys[0] = 99
    assert positions[0] == 0


def test_global_positions_interleave_the_shards() -> None:
    sampler = IndexSampler(10, ShardOptions(2, 3))
    assert sampler.global_positions(np.arange(4)).tolist() == [2, 5, 8, 11]


def test_sequential_sampler_reads_once_in_order() -> None:
    sampler = SequentialSampler(5, seed=2)
    assert (sampler.shuffle, sampler.num_epochs, sampler.seed) == (False, 1, 2)
    assert _all_keys(sampler) == [0, 1, 2, 3, 4]


def test_sequential_sampler_shards_interleave() -> None:
    assert _all_keys(SequentialSampler(5, ShardOptions(0, 2))) == [0, 2, 4]


def test_with_shard_options_keeps_everything_else() -> None:
    sampler = IndexSampler(10, shuffle=True, num_epochs=2, seed=5)
    other = sampler.with_shard_options(ShardOptions(1, 2))
    assert type(other) is IndexSampler
    assert (other.num_records, other.shuffle, other.num_epochs, other.seed) == (10, True, 2, 5)
    assert other.shard_options == ShardOptions(1, 2)
    assert sampler.shard_options == NoSharding()


def test_with_shard_options_keeps_a_sequential_sampler_sequential() -> None:
    other = SequentialSampler(10, seed=1).with_shard_options(ShardOptions(1, 2))
    assert type(other) is SequentialSampler
    assert other.seed == 1


def test_describe_is_json_and_complete() -> None:
    sampler = IndexSampler(10, ShardOptions(1, 2, True), shuffle=True, num_epochs=3, seed=5)
    description = sampler.describe()
    assert (
        json.loads(json.dumps(description))
        == description
        == {
            "kind": "IndexSampler",
            "num_records": 10,
            "shuffle": True,
            "seed": 5,
            "num_epochs": 3,
            "shard_index": 1,
            "shard_count": 2,
            "drop_remainder": True,
        }
    )


def test_repr_is_stable() -> None:
    assert repr(IndexSampler(10, shuffle=True, seed=5)) == (
        "IndexSampler(num_records=10, shard_options=NoSharding(shard_index=0, shard_count=1, "
        "drop_remainder=False), shuffle=True, num_epochs=None, seed=5)"
    )
    assert repr(SequentialSampler(3)) == (
        "SequentialSampler(num_records=3, shard_options=NoSharding(shard_index=0, shard_count=1, "
        "drop_remainder=False), seed=None)"
    )


def test_samplers_survive_pickling() -> None:
    for sampler in (
        IndexSampler(10, ShardOptions(1, 3), shuffle=True, seed=5),
        SequentialSampler(4, seed=1),
    ):
        copy = pickle.loads(pickle.dumps(sampler))
        assert copy == sampler
        assert type(copy) is type(sampler)
        assert (
            copy.record_keys(np.arange(20) % len(copy)).tolist()
            == sampler.record_keys(np.arange(20) % len(sampler)).tolist()
        )


def test_samplers_compare_by_description() -> None:
    assert IndexSampler(10, seed=1) == IndexSampler(10, NoSharding(), seed=1)
    assert hash(IndexSampler(10, seed=1)) == hash(IndexSampler(10, ShardOptions(0, 1), seed=1))
    assert IndexSampler(10, seed=1) != IndexSampler(10, seed=2)
    assert SequentialSampler(10) != IndexSampler(10, num_epochs=1)


def test_samplers_are_immutable() -> None:
    sampler = IndexSampler(10)
    with pytest.raises(AttributeError, match="IndexSampler is immutable, cannot set 'seed'"):
        sampler.seed = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"num_records": 0},
            ValueError,
            r"num_records must be in \[1, 2\*\*63\], got 0; an empty data source",
        ),
        ({"num_records": -3}, ValueError, r"num_records must be in \[1, 2\*\*63\], got -3"),
        (
            {"num_records": True},
            TypeError,
            "num_records must be an int, got True of type bool; pass len",
        ),
        ({"num_records": 1.5}, TypeError, "num_records must be an int, got 1.5 of type float"),
        (
            {"num_records": 5, "shard_options": (0, 1)},
            TypeError,
            "shard_options must be a ShardOptions, got",
        ),
        (
            {"num_records": 5, "shuffle": 1, "seed": 0},
            TypeError,
            "shuffle must be a bool, got 1 of type int",
        ),
        (
            {"num_records": 5, "shuffle": True},
            ValueError,
            r"shuffle=True needs an integer seed, got None; pass seed=\.\.\.",
        ),
        ({"num_records": 5, "seed": -1}, ValueError, r"seed must be in \[0, 2\*\*63\), got -1"),
        (
            {"num_records": 5, "seed": 2**63},
            ValueError,
            r"seed must be in \[0, 2\*\*63\), got 9223372036854775808",
        ),
        (
            {"num_records": 5, "seed": "7"},
            TypeError,
            "seed must be an int or None, got '7' of type str",
        ),
        (
            {"num_records": 5, "num_epochs": 0},
            ValueError,
            "num_epochs must be positive or None, got 0",
        ),
        (
            {"num_records": 5, "num_epochs": 2.0},
            TypeError,
            "num_epochs must be an int or None, got 2.0",
        ),
        (
            {"num_records": 2**62, "num_epochs": 3},
            ValueError,
            r"num_records \* num_epochs = .* exceeds 2\*\*63 global positions",
        ),
    ],
)
def test_invalid_arguments_are_refused(
    kwargs: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        IndexSampler(**kwargs)  # type: ignore[arg-type]


def test_numpy_integers_are_accepted_as_arguments() -> None:
    sampler = IndexSampler(np.int64(10), shuffle=True, num_epochs=np.int32(2), seed=np.uint8(3))
    assert {type(sampler.num_records), type(sampler.num_epochs), type(sampler.seed)} == {int}
