"""Grain's DataLoader states read as granary's, only where the continuation is exact."""

from __future__ import annotations

import pytest

from dataloader.engine.restore.grain import (
    dataset_next_index,
    from_grain,
    from_grain_dataset,
    is_grain_state,
    parse_sampler,
    reads_grains_order,
)
from dataloader.errors import StateMismatchError
from dataloader.samplers import IndexSampler

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


def test_dataset_next_index_reads_grains_nested_states():
    """Shapes grain 0.2.18 saves: a dataset iterator, mp_prefetch of one worker (an
    interleave's state), and the older per-worker mp_prefetch state."""
    assert dataset_next_index({"next_index": 20}) == 20
    interleave = {"next_index_in_cycle": 0, "next_index_in_datasets": 1, "iterators_in_use_indices": [0],
                  "iterators_in_use_states": [{"next_index": 20}], "exhausted": [0], "future_states": {}}
    assert dataset_next_index(interleave) == 20
    assert dataset_next_index({"workers_state": {"0": {"next_index": 5}}, "iterations_to_skip": {"0": 0},
                               "last_worker_index": 0}) == 5


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ({"workers_state": {"0": {"next_index": 5}, "1": {"next_index": 4}}, "iterations_to_skip": {}},
         r"saved by 2 mp_prefetch workers"),
        ({"next_index": -1}, r"not a non-negative integer"),
        ({"next_index": True}, r"not a non-negative integer"),
    ],
)
def test_dataset_next_index_refuses_what_cannot_continue(state, message):
    with pytest.raises(StateMismatchError, match=message):
        dataset_next_index(state)


def test_from_grain_dataset_moves_the_position_and_keeps_what_it_was_made_for():
    current = granary(position=0)
    moved = from_grain_dataset({"next_index": 3}, current, grain_order=True, positions_per_index=5, end=13)
    assert moved == {**current, "position": 13}  # a short last batch ends the stream at 13
    with pytest.raises(StateMismatchError, match=r"stages with state of their own \(tail\)"):
        from_grain_dataset({"next_index": 3}, {**current, "tail": {}}, grain_order=True)


def test_reads_grains_order_by_sampler():
    assert reads_grains_order(IndexSampler(10))
    assert reads_grains_order(IndexSampler(10, shuffle=True, seed=1, permutation="grain"))
    assert not reads_grains_order(IndexSampler(10, shuffle=True, seed=1))
