"""Mixing: exact proportions over windows, determinism, lengths, epochs, specs, errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dataloader as dl
from dataloader.dataset.compile.mixing import LOOKUP_PERIOD, MixSchedule, parse_mixture_spec
from dataloader.dataset.experimental.mix import MixIterDataset


def components_of(ds, n):
    """Which component (0: values < 1000) each of the first n elements came from."""
    return np.asarray([int(x >= 1000) for x in ds[:n]])


def two_endless(weights, seed=1):
    a = dl.MapDataset.range(0, 37).seed(seed).shuffle().repeat()
    b = dl.MapDataset.range(1000, 1011).seed(seed + 1).shuffle().repeat()
    return dl.MapDataset.mix([a, b], weights)


# Golden sequences: the components (and, for some, the index within each) of the first
# 40 elements of grain.MapDataset.mix / grain.IterDataset.mix with these weights, as
# printed by grain 0.2.18 (mixing MapDataset.range(c * 10**6, ...) and reading c, k off
# each element). They are also what the nested ceil/floor rule of mixing.py gives by hand:
# for [0.3, 0.7] the proportions are [100, 233] and component 0 is at positions
# floor(k * 333 / 100) = 0, 3, 6, 9, 13, ...
GRAIN_ORDER = [
    ([0.3, 0.7], "0110110110111011011011101101101110110110", [0, 0, 1, 1, 2, 3, 2, 4, 5, 3, 6, 7]),
    ([0.7, 0.3], "0001001001000100100100010010010001001001", [0, 1, 2, 0, 3, 4, 1, 5, 6, 2, 7, 8]),
    ([1, 2, 3], "0121220121220121220121220121220121220121", [0, 0, 0, 1, 1, 2, 1, 2, 3, 3, 4, 5]),
    ([0.2, 0.3, 0.5], "0121202122012120212201212021220121202122", [0, 0, 0, 1, 1, 1, 2, 2, 3, 4, 2, 3]),
    ([5, 3, 1, 1], "0101020103010102010301010201030101020103", [0, 0, 1, 1, 2, 0, 3, 2, 4, 0, 5, 3]),
    ([0.1, 0.2, 0.3, 0.4, 0.5], "0123432413423440123432413423440123432413", [0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2]),
    ([7, 0.01, 3], "0001002002000200200200020020020002002002", [0, 1, 2, 0, 3, 4, 0, 5, 6, 1, 7, 8]),
    (None, "0101010101010101010101010101010101010101", [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]),
]


def tagged(n, length=10**5):
    """Component c holds c * 10**6 + k at index k, so an element says where it came from."""
    return [dl.MapDataset.range(c * 10**6, c * 10**6 + length) for c in range(n)]


@pytest.mark.parametrize(("weights", "order", "within"), GRAIN_ORDER)
def test_map_dataset_mix_draws_in_grains_order(weights, order, within):
    n = 2 if weights is None else len(weights)
    got = dl.MapDataset.mix(tagged(n), weights)[:40]
    assert "".join(str(x // 10**6) for x in got) == order
    assert [x % 10**6 for x in got[:12]] == within


@pytest.mark.parametrize(("weights", "order", "within"), GRAIN_ORDER)
def test_iter_dataset_mix_draws_in_grains_order(weights, order, within):
    n = 2 if weights is None else len(weights)
    engine = dl.IterDataset.mix([d.to_iter_dataset() for d in tagged(n)], weights)
    iterator_level = MixIterDataset([d.to_iter_dataset() for d in tagged(n)], weights, None)
    for ds in (engine, iterator_level):
        it = iter(ds)
        got = [next(it) for _ in range(40)]
        assert "".join(str(x // 10**6) for x in got) == order
        assert [x % 10**6 for x in got[:12]] == within


def test_dict_mixture_draws_in_grains_order_of_sorted_keys():
    """Grain flattens a dict by sorted keys: k00, k13, k22, k31 mix as 5, 1, 1, 3."""
    keys, weights = ["k00", "k31", "k22", "k13"], [5, 3, 1, 1]
    parts = tagged(4)
    ds = dl.IterDataset.mix(
        {k: d.to_iter_dataset() for k, d in zip(keys, parts)}, dict(zip(keys, weights))
    )
    it = iter(ds)
    got = "".join(str(next(it) // 10**6) for _ in range(40))
    assert got == "0302010101030201010103020101010302010101"  # grain 0.2.18's output


def nested_order(proportions, n):
    """The first ``n`` (component, index) pairs built level by level, the way the rule reads.

    Level c spreads component c over the positions the earlier components left, taking
    position j of the level when ceil((j + 1) * p_c / rest) steps up.
    """
    slots = list(range(n))
    out = [None] * n
    for c, p in enumerate(proportions):
        rest = sum(proportions[c:])
        left = []
        for j, pos in enumerate(slots):
            if c == len(proportions) - 1 or -(-(j + 1) * p // rest) != -(-j * p // rest):
                out[pos] = (c, -(-j * p // rest))
            else:
                left.append(pos)
        slots = left
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=5))
def test_locate_follows_the_nested_rule_and_position_of_inverts_it(weights):
    s = MixSchedule(weights)
    n = 3 * s.period + 5
    comp, ks = s.locate(np.arange(n))
    expected = nested_order(s.counts, n)
    assert list(zip(comp.tolist(), ks.tolist())) == expected
    computed = s._compute(np.arange(n))  # the path of periods too long for a table
    assert computed[0].tolist() == comp.tolist() and computed[1].tolist() == ks.tolist()
    # ... and the walk of many components, over runs and over scattered positions
    shuffled = np.random.default_rng(len(weights)).permutation(n)
    for positions in (np.arange(n), shuffled, shuffled[: n // 3]):
        walked = s._walk(positions)
        assert list(zip(*(a.tolist() for a in walked))) == [expected[p] for p in positions]
    assert [s.locate_one(i) for i in range(0, n, 7)] == expected[::7]
    assert [s.position_of(c, k) for c, k in expected] == list(range(n))


def test_every_window_of_one_period_has_the_exact_proportions():
    s = MixSchedule([0.3, 0.7])  # Grain reads these as 100 and 233
    assert (s.counts, s.period) == ([100, 233], 333)
    comp = components_of(two_endless([0.3, 0.7]), 1200)
    windows = np.lib.stride_tricks.sliding_window_view(comp, 333)
    assert set(windows.sum(axis=1).tolist()) == {233}


def test_any_window_is_within_one_of_the_first_components_share():
    comp = components_of(two_endless([0.25, 0.75]), 300)
    cums = np.concatenate([[0], np.cumsum(comp)])
    for width in (3, 7, 13, 50):
        counts = cums[width:] - cums[:-width]
        assert np.abs(counts - 0.75 * width).max() <= 1.0


def test_weights_in_the_same_ratio_mix_alike_through_grains_scaling():
    assert MixSchedule([1, 2]).table.tolist() == MixSchedule([0.5, 1]).table.tolist()
    assert MixSchedule([2, 4]).counts == [100, 200]
    # 3/7 and 0.3/0.7 are not read alike: int(0.7 * (100 / 0.3)) is 233, as in Grain
    assert MixSchedule([3, 7]).counts == [100, 233] == MixSchedule([0.3, 0.7]).counts
    assert MixSchedule([0.7, 0.3]).counts == [233, 100]


def test_position_maps_to_the_component_and_its_index_in_o1():
    s = MixSchedule([1, 2])
    positions = np.concatenate([np.arange(12), 10**15 + np.arange(4)]).astype(np.int64)
    comp, ks = s.locate(positions)
    assert comp[:4].tolist() == [0, 1, 1, 0] and ks[:4].tolist() == [0, 0, 1, 1]
    assert [s.position_of(int(c), int(k)) for c, k in zip(comp, ks)] == positions.tolist()


def test_a_long_period_is_located_without_a_table():
    s = MixSchedule([1, 1e-9])  # proportions [100000000000, 100]: Grain accepts it too
    assert s.counts == [10**11, 100] and s.period > 2**31
    positions = np.asarray([0, 1, 999_999_999, 1_000_000_000, 1_000_000_001, 3 * 10**12 + 7])
    comp, ks = s.locate(positions)
    assert [s.locate_one(int(p)) for p in positions] == list(zip(comp.tolist(), ks.tolist()))
    assert comp.tolist()[:2] == [0, 0] and int((comp == 1).sum()) >= 1
    assert [s.position_of(int(c), int(k)) for c, k in zip(comp, ks)] == positions.tolist()
    with pytest.raises(ValueError, match=r"period is 100000000100 positions .* use locate"):
        _ = s.table


def test_a_mixture_of_thousands_of_components_locates_runs_and_single_positions_alike():
    weights = [1 + (i % 7) * 0.37 for i in range(3000)]
    s = MixSchedule(weights)
    assert s.period > LOOKUP_PERIOD and math.gcd(*s.counts) == 1
    positions = np.concatenate([np.arange(5000, 5100), [7, 3 * s.period + 11, 10**15]])
    comp, ks = s.locate(positions)
    assert [s.locate_one(int(p)) for p in positions] == list(zip(comp.tolist(), ks.tolist()))
    assert [s.position_of(int(c), int(k)) for c, k in zip(comp, ks)] == positions.tolist()


def test_proportions_with_a_common_factor_locate_as_their_reduced_layout():
    s = MixSchedule([1, 2, 4] * 3000)  # Grain's proportions 100, 200, 400: a table of 21,000
    assert s.period == 2_100_000 > LOOKUP_PERIOD
    positions = np.arange(s.period - 50, s.period + 50)
    comp, ks = s.locate(positions)
    assert [s.locate_one(int(p)) for p in positions] == list(zip(comp.tolist(), ks.tolist()))


def test_grain_map_length_is_grains_float_formula():
    s = MixSchedule([0.3, 0.7])
    assert s.grain_map_length([10, 10]) == int(min(10 / (100 / 333), 10 / (233 / 333))) == 14
    assert s.grain_map_length([None, 7]) == 10


def test_mixture_sampler_refuses_float_positions_as_index_sampler_does():
    mixed = dl.MapDataset.mix([dl.MapDataset.range(3), dl.MapDataset.range(10, 14)])
    sampler = mixed.to_iter_dataset().loader.sampler
    assert type(sampler).__name__ == "IndexMapSampler"
    for s in (sampler, dl.IndexSampler(10)):
        with pytest.raises(TypeError, match=r"positions must be integers, got an array of dtype float64"):
            s.record_keys([1.9, 2.2])


def test_a_mixture_with_an_empty_batched_component_is_refused_and_an_empty_concatenation_is_empty_on_every_shard():
    """Grain refuses to mix a dataset of length 0 (it has nothing to draw); a concatenation
    of batched datasets that dropped their only, short, batch is an empty index-map stream,
    with no position on any shard."""
    empty = dl.MapDataset.range(3).batch(4, drop_remainder=True)
    with pytest.raises(ValueError, match=r"MapDataset\.mix: dataset 0 \(.*Batch\(4, drop_remainder=True\)\)\) has length 0"):
        dl.MapDataset.mix([empty, dl.MapDataset.range(5).batch(1)])
    both = dl.MapDataset.concatenate([empty, dl.MapDataset.range(2).batch(4, drop_remainder=True)])
    assert len(both) == 0
    assert [list(both.to_iter_dataset(shard_options=dl.ShardOptions(h, 2))) for h in range(2)] == [[], []]


def test_mixture_repeated_past_2_to_the_63_positions_is_refused():
    mixed = dl.MapDataset.mix([dl.MapDataset.range(5), dl.MapDataset.range(7, 10)]).repeat(2 * 10**18)
    with pytest.raises(ValueError, match=r"one pass of this dataset has 12000000000000000000 positions, more than the 2\*\*63"):
        mixed[3]


def test_each_component_moves_through_its_own_epochs():
    ds = two_endless([0.5, 0.5])
    small = [x - 1000 for x in ds[:66] if x >= 1000]  # 33 draws of an 11-record component
    epochs = [small[i : i + 11] for i in range(0, 33, 11)]
    assert all(sorted(e) == list(range(11)) for e in epochs)
    assert epochs[0] != epochs[1]


def test_one_pass_is_as_long_as_grains():
    """Grain 0.2.18: len(MapDataset.mix([range(5), range(7, 10)])) == int(min(5/.5, 3/.5)) == 6,
    one element short of where the second component runs out (IterDataset.mix goes to 7)."""
    a, b = dl.MapDataset.range(5), dl.MapDataset.range(7, 10)
    assert list(dl.MapDataset.mix([a, b])) == [0, 7, 1, 8, 2, 9]
    assert list(dl.IterDataset.mix([a.to_iter_dataset(), b.to_iter_dataset()])) == [0, 7, 1, 8, 2, 9, 3]


def test_a_finite_mixture_repeats_by_drawing_on():
    """As Grain 0.2.18's list(MapDataset.mix([range(4), range(10, 12)]).repeat(2))."""
    a, b = dl.MapDataset.range(4), dl.MapDataset.range(10, 12)
    mixed = dl.MapDataset.mix([a, b]).repeat(2)
    assert list(mixed) == [0, 10, 1, 11, 2, 10, 3, 11]


def test_component_operations_apply_to_their_component_only():
    a = dl.MapDataset.range(3).map(lambda x: -x - 1)
    b = dl.MapDataset.range(100, 103)
    assert list(dl.MapDataset.mix([a, b])) == [-1, 100, -2, 101, -3, 102]


@pytest.mark.parametrize(("weights", "bad"), [([1, 0], r"weights\[1\] is 0"), ([1, -0.5], r"weights\[1\] is -0.5")])
def test_zero_and_negative_weights_are_refused_as_in_grain(weights, bad):
    with pytest.raises(ValueError, match=bad + r"; weights must be finite and > 0, as in Grain"):
        dl.MapDataset.mix([dl.MapDataset.range(2), dl.MapDataset.range(2)], weights)


def test_weights_too_far_apart_to_scale_are_refused():
    with pytest.raises(ValueError, match=r"weights\[1\] is 1e\+300, inf times the smallest"):
        MixSchedule([1e-300, 1e300])


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
    assert sum(x >= 1000 for x in first) == 13  # Grain's order: 01101101101110110110...
    assert {x for x in first if x < 1000} <= {0, 1, 2, 3, 4, 10, 11, 12, 13, 14}


def test_spec_shuffle_that_is_not_a_bool_is_refused():
    with pytest.raises(TypeError, match=r"mix_from_spec shuffle must be True or False, got 'yes' of type str"):
        dl.MapDataset.mix_from_spec("a*.array_record:1", seed=3, shuffle="yes")


def test_schedule_sent_to_a_worker_locates_alike():
    import pickle

    s = MixSchedule([123456789, 987654321, 5])  # a period of about 2.2e10 positions
    positions = np.arange(0, 10**12, 10**9 + 7)
    copy = pickle.loads(pickle.dumps(s))
    assert copy.counts == s.counts
    assert all(np.array_equal(x, y) for x, y in zip(copy.locate(positions), s.locate(positions)))
