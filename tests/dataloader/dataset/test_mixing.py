"""Mixing: exact proportions over windows, determinism, lengths, epochs, specs, errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dataloader as dl
from dataloader.dataset.compile.mixing import MixSchedule, parse_mixture_spec


def components_of(ds, n):
    """Which component (0: values < 1000) each of the first n elements came from."""
    return np.asarray([int(x >= 1000) for x in ds[:n]])


def two_endless(weights, seed=1):
    a = dl.MapDataset.range(0, 37).seed(seed).shuffle().repeat()
    b = dl.MapDataset.range(1000, 1011).seed(seed + 1).shuffle().repeat()
    return dl.MapDataset.mix([a, b], weights)


def test_every_window_of_one_period_has_the_exact_proportions():
    comp = components_of(two_endless([0.3, 0.7]), 400)
    windows = np.lib.stride_tricks.sliding_window_view(comp, 10)
    assert set(windows.sum(axis=1).tolist()) == {7}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=2, max_size=6))
def test_every_prefix_stays_within_tijdemans_bound_of_its_share(counts):
    s = MixSchedule(counts)
    k = len(counts)
    bound = 1 - 1 / (2 * k - 2) if k > 1 else 0
    table = np.tile(s.table, 2)
    drawn = np.cumsum(table[:, None] == np.arange(len(counts))[None, :], axis=0)
    share = np.arange(1, 2 * s.period + 1)[:, None] * np.asarray(s.counts)[None, :] / s.period
    assert np.abs(drawn - share).max() <= bound + 1e-9
    assert [int((s.table == c).sum()) for c in range(len(counts))] == s.counts


def test_any_window_is_within_twice_the_prefix_bound_of_its_share():
    comp = components_of(two_endless([0.25, 0.75]), 300)
    cums = np.concatenate([[0], np.cumsum(comp)])
    for width in (3, 7, 13, 50):
        counts = cums[width:] - cums[:-width]
        assert np.abs(counts - 0.75 * width).max() <= 1.0  # 2 * (1 - 1/2) for two components


def test_weights_are_normalised():
    assert MixSchedule([3, 7]).table.tolist() == MixSchedule([0.3, 0.7]).table.tolist()


def test_position_maps_to_the_component_and_its_index_in_o1():
    s = MixSchedule([1, 2])
    positions = np.concatenate([np.arange(12), 10**15 + np.arange(4)]).astype(np.int64)
    comp, ks = s.locate(positions)
    assert comp[:4].tolist() == [1, 0, 1, 1] and ks[:4].tolist() == [0, 0, 1, 2]
    assert [s.position_of(int(c), int(k)) for c, k in zip(comp, ks)] == positions.tolist()


def test_mixture_sampler_refuses_float_positions_as_index_sampler_does():
    mixed = dl.MapDataset.mix([dl.MapDataset.range(3), dl.MapDataset.range(10, 14)])
    sampler = mixed.to_iter_dataset().loader.sampler
    assert type(sampler).__name__ == "IndexMapSampler"
    for s in (sampler, dl.IndexSampler(10)):
        with pytest.raises(TypeError, match=r"positions must be integers, got an array of dtype float64"):
            s.record_keys([1.9, 2.2])


def test_mixture_with_an_empty_batched_component_is_empty_on_every_shard():
    empty = dl.MapDataset.range(3).batch(4, drop_remainder=True)
    mixed = dl.MapDataset.mix([empty, dl.MapDataset.range(5).batch(1)])
    assert len(mixed) == 0
    assert [list(mixed.to_iter_dataset(shard_options=dl.ShardOptions(h, 2))) for h in range(2)] == [[], []]


def test_mixture_repeated_past_2_to_the_63_positions_is_refused():
    mixed = dl.MapDataset.mix([dl.MapDataset.range(5), dl.MapDataset.range(7, 10)]).repeat(2 * 10**18)
    with pytest.raises(ValueError, match=r"one pass of this dataset has 14000000000000000000 positions, more than the 2\*\*63"):
        mixed[3]


def test_each_component_moves_through_its_own_epochs():
    ds = two_endless([0.5, 0.5])
    small = [x - 1000 for x in ds[:66] if x >= 1000]  # 33 draws of an 11-record component
    epochs = [small[i : i + 11] for i in range(0, 33, 11)]
    assert all(sorted(e) == list(range(11)) for e in epochs)
    assert epochs[0] != epochs[1]


def test_one_pass_ends_where_the_first_component_runs_out():
    a, b = dl.MapDataset.range(5), dl.MapDataset.range(7, 10)
    assert list(dl.MapDataset.mix([a, b])) == [0, 7, 1, 8, 2, 9, 3]


def test_a_finite_mixture_repeats_by_drawing_on():
    a, b = dl.MapDataset.range(4), dl.MapDataset.range(10, 12)
    mixed = dl.MapDataset.mix([a, b]).repeat(2)
    assert list(mixed) == [0, 10, 1, 11, 2, 10, 3, 11, 0, 10]


def test_component_operations_apply_to_their_component_only():
    a = dl.MapDataset.range(3).map(lambda x: -x - 1)
    b = dl.MapDataset.range(100, 103)
    assert list(dl.MapDataset.mix([a, b])) == [-1, 100, -2, 101, -3, 102]


@pytest.mark.parametrize(("weights", "bad"), [([1, 0], r"weights\[1\] is 0"), ([1, -0.5], r"weights\[1\] is -0.5")])
def test_zero_and_negative_weights_are_refused_as_in_grain(weights, bad):
    with pytest.raises(ValueError, match=bad + r"; weights must be finite and > 0, as in Grain"):
        dl.MapDataset.mix([dl.MapDataset.range(2), dl.MapDataset.range(2)], weights)


def test_a_weight_too_small_to_be_drawn_is_refused():
    with pytest.raises(ValueError, match=r"weights \[1e-09\] are too small beside the others"):
        dl.MapDataset.mix([dl.MapDataset.range(2), dl.MapDataset.range(2)], [1, 1e-9])


def test_wrong_number_of_weights_is_refused():
    with pytest.raises(ValueError, match="got 3 weights for 2 datasets"):
        dl.MapDataset.mix([dl.MapDataset.range(2), dl.MapDataset.range(2)], [1, 2, 3])


def test_spec_is_parsed_with_normalised_weights_and_colons_in_paths():
    got = parse_mixture_spec("gs://bucket/a*.array_record:1; b-*.array_record:3")
    assert got == [("gs://bucket/a*.array_record", 0.25), ("b-*.array_record", 0.75)]


def test_spec_part_without_weight_is_refused():
    with pytest.raises(ValueError, match=r"part 1 of the mixture spec \('b\*\.array_record'\) has no weight"):
        parse_mixture_spec("a*.array_record:0.3;b*.array_record")


def test_spec_builds_array_record_components(tmp_path):
    for name, base in (("a", 0), ("b", 1000)):
        for shard in range(2):
            dl.write_array_record(
                tmp_path / f"{name}-{shard}.array_record",
                [str(base + 10 * shard + i).encode() for i in range(5)],
            )
    spec = f"{tmp_path}/a-*.array_record:0.3;{tmp_path}/b-*.array_record:0.7"
    ds = dl.MapDataset.mix_from_spec(spec, seed=3, shuffle=True, num_epochs=None).map(int)
    first = ds[:20]
    assert sum(x >= 1000 for x in first) == 14
    assert {x for x in first if x < 1000} <= {0, 1, 2, 3, 4, 10, 11, 12, 13, 14}


def test_spec_shuffle_that_is_not_a_bool_is_refused():
    with pytest.raises(TypeError, match=r"mix_from_spec shuffle must be True or False, got 'yes' of type str"):
        dl.MapDataset.mix_from_spec("a*.array_record:1", seed=3, shuffle="yes")


def test_schedule_sent_to_a_worker_has_the_same_table():
    import pickle

    s = MixSchedule([123456789, 987654321, 5])  # a period too long to be exact: rounded once
    assert pickle.loads(pickle.dumps(s)).table.tolist() == s.table.tolist()
    assert s.period == 2**16
