"""Grain's DataLoader states read as granary's, only where the continuation is exact."""

from __future__ import annotations

import pytest

from dataloader.engine.grain_state import from_grain, is_grain_state, parse_sampler
from dataloader.errors import StateMismatchError

SAMPLER = ("IndexSampler(num_records=30, shard_options=ShardOptions(shard_index={}, shard_count={}, "
           "drop_remainder=False), shuffle={}, num_epochs=2, seed={})")


def granary(shard=(0, 1), shuffle=False, seed=None, position=7):
    made_for = {"num_records": 30, "shuffle": shuffle, "seed": seed, "num_epochs": 2,
                "shard_index": shard[0], "shard_count": shard[1], "batch_size": 5,
                "layout": "batch", "operations": ["Batch(drop_remainder=False)"]}
    return {"version": 1, "position": position, "sub_index": 0, "skip": 0, "made_for": made_for}


def grain(last_seen, shard=(0, 1), shuffle=False, seed=None, workers=0):
    return {"version": 2, "last_seen_indices": {str(i): v for i, v in enumerate(last_seen)},
            "last_worker_index": -1, "worker_count": workers,
            "sampler": SAMPLER.format(shard[0], shard[1], shuffle, seed), "data_source": "RangeDataSource()"}


def test_parse_sampler_reads_the_fields_made_for_also_has():
    assert parse_sampler(SAMPLER.format(1, 2, True, 7)) == {
        "num_records": 30, "shuffle": True, "seed": 7, "num_epochs": 2, "shard_index": 1, "shard_count": 2}


def test_parse_sampler_refuses_a_sampler_without_its_size():
    with pytest.raises(StateMismatchError, match=r"does not say its num_records, shard_index, shard_count"):
        parse_sampler("SequentialSampler()")


def test_is_grain_state_tells_grain_states_from_granary_states():
    assert is_grain_state(grain([4])) and is_grain_state({"next_index": 3})
    assert not is_grain_state(granary()) and not is_grain_state({"global_next_index": 8})


@pytest.mark.parametrize(
    ("last_seen", "shard", "position"),
    [([9], (0, 1), 10), ([-1], (0, 1), 0), ([29], (1, 2), 15), ([58], (0, 2), 30)],
)
def test_the_next_local_position_follows_the_last_seen_global_index(last_seen, shard, position):
    converted = from_grain(grain(last_seen, shard), granary(shard))
    assert converted == {**granary(shard), "position": position}


def test_a_sharded_state_mid_epoch_is_refused():
    with pytest.raises(StateMismatchError, match=r"middle of a sharded epoch \(local position 5\)"):
        from_grain(grain([9], (1, 2)), granary((1, 2)))


def test_a_state_for_another_sharding_names_each_difference():
    with pytest.raises(StateMismatchError, match=r"shard_index=1 but this iterator has shard_index=0; "
                                                  r"shard_count=2 but this iterator has shard_count=1"):
        from_grain(grain([29], (1, 2)), granary())


def test_a_grain_state_into_an_iterator_without_positions_is_refused():
    with pytest.raises(StateMismatchError, match=r"restores only into a granary DataLoader"):
        from_grain(grain([9]), {"global_next_index": 8, "made_for": {}})
