"""Tests of shard options and the shard arithmetic (samplers/sharding.py)."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from dataloader.samplers import NoSharding, ShardByJaxProcess, ShardOptions
from dataloader.samplers.sharding import shard_length


def test_shard_length_counts_the_positions_of_the_shard() -> None:
    for total in range(60):
        for count in range(1, 8):
            for index in range(count):
                expected = sum(1 for g in range(total) if g % count == index)
                assert shard_length(total, index, count, drop_remainder=False) == expected


def test_shard_length_with_drop_remainder_is_equal_for_all_shards() -> None:
    for total in range(60):
        for count in range(1, 8):
            lengths = {
                shard_length(total, index, count, drop_remainder=True) for index in range(count)
            }
            assert lengths == {total // count}


def test_shard_options_keep_their_fields() -> None:
    options = ShardOptions(shard_index=2, shard_count=4, drop_remainder=True)
    assert (options.shard_index, options.shard_count, options.drop_remainder) == (2, 4, True)


def test_shard_index_past_the_count_is_refused() -> None:
    with pytest.raises(
        ValueError,
        match=r"shard_index must be in \[0, shard_count\) = \[0, 4\), got 5; shards are numbered from 0",
    ):
        ShardOptions(shard_index=5, shard_count=4)


def test_negative_shard_index_is_refused() -> None:
    with pytest.raises(
        ValueError, match=r"shard_index must be in \[0, shard_count\) = \[0, 2\), got -1"
    ):
        ShardOptions(shard_index=-1, shard_count=2)


def test_shard_count_below_one_is_refused() -> None:
    with pytest.raises(
        ValueError, match="shard_count must be at least 1, got 0; use 1 for no sharding"
    ):
        ShardOptions(shard_index=0, shard_count=0)


@pytest.mark.parametrize("bad", [1.0, "1", True, None])
def test_shard_count_that_is_not_an_int_is_refused(bad: object) -> None:
    with pytest.raises(TypeError, match=r"shard_count must be an int, got .* of type"):
        ShardOptions(shard_index=0, shard_count=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0.0, "0", False])
def test_shard_index_that_is_not_an_int_is_refused(bad: object) -> None:
    with pytest.raises(TypeError, match=r"shard_index must be an int, got .* of type"):
        ShardOptions(shard_index=bad, shard_count=2)  # type: ignore[arg-type]


def test_drop_remainder_that_is_not_a_bool_is_refused() -> None:
    with pytest.raises(
        TypeError, match="drop_remainder must be a bool, got 1 of type int; pass True or False"
    ):
        ShardOptions(shard_index=0, shard_count=2, drop_remainder=1)  # type: ignore[arg-type]


def test_shard_options_are_frozen() -> None:
    options = ShardOptions(shard_index=0, shard_count=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.shard_index = 1  # type: ignore[misc]


def test_replace_validates_the_new_options() -> None:
    options = ShardOptions(shard_index=0, shard_count=2)
    assert dataclasses.replace(options, shard_index=1).shard_index == 1
    with pytest.raises(ValueError, match="shard_index must be in"):
        dataclasses.replace(options, shard_index=2)


def test_no_sharding_is_shard_0_of_1() -> None:
    options = NoSharding()
    assert isinstance(options, ShardOptions)
    assert (options.shard_index, options.shard_count, options.drop_remainder) == (0, 1, False)


def test_no_sharding_equals_the_same_plain_options() -> None:
    assert NoSharding() == ShardOptions(shard_index=0, shard_count=1)
    assert hash(NoSharding()) == hash(ShardOptions(shard_index=0, shard_count=1))
    assert NoSharding() != ShardOptions(shard_index=0, shard_count=1, drop_remainder=True)


def test_repr_names_the_class_and_fields() -> None:
    assert repr(NoSharding()) == "NoSharding(shard_index=0, shard_count=1, drop_remainder=False)"
    assert (
        repr(ShardOptions(1, 3))
        == "ShardOptions(shard_index=1, shard_count=3, drop_remainder=False)"
    )


def test_shard_options_survive_pickling() -> None:
    for options in (ShardOptions(1, 3, True), NoSharding(), ShardByJaxProcess(drop_remainder=True)):
        copy = pickle.loads(pickle.dumps(options))
        assert copy == options
        assert type(copy) is type(options)


def test_shard_by_jax_process_in_one_process_is_shard_0_of_1() -> None:
    options = ShardByJaxProcess()
    assert isinstance(options, ShardOptions)
    assert (options.shard_index, options.shard_count, options.drop_remainder) == (0, 1, False)


def test_shard_by_jax_process_keeps_drop_remainder() -> None:
    assert ShardByJaxProcess(drop_remainder=True).drop_remainder is True
