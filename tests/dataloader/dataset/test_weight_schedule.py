"""WeightSchedule: weights that change along the mixture, as a pure function of position.

Draws numbered without gaps, shares per piece, restores at every step around a switch
(plain, batched, on workers, iterator level), elastic 2 -> 3 hosts across a switch, and
the refusals at construction.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dataloader as dl
from dataloader.dataset.compile.scheduled_mix import _draws_before
from tests.helpers import assert_restores_everywhere, take

# switches at 12 and 30, a component off before the first
STEPS = dl.WeightSchedule([(0, [1, 0, 2]), (12, [1, 1, 1]), (30, [0.3, 0.7, 0.1])])
RAMP = dl.WeightSchedule([(0, [1, 0]), (10, [1, 0]), (40, [1, 3]), (40, [0, 1])], interpolation="linear",
                         ramp_pieces=6)


def tagged(n, length=10**5):
    """Component c holds c * 10**6 + k at index k, so an element says where it came from."""
    return [dl.MapDataset.range(c * 10**6, c * 10**6 + length) for c in range(n)]


@pytest.mark.parametrize("schedule", [STEPS, RAMP], ids=["steps", "ramp"])
def test_each_components_draws_are_numbered_without_gaps_or_repeats(schedule):
    mixed = dl.MapDataset.mix(tagged(len(schedule)), schedule)
    got = np.asarray(mixed[:3000])
    for c in range(len(schedule)):
        k = got[got // 10**6 == c] % 10**6
        assert k.tolist() == list(range(len(k)))  # each record once, in its own order


@pytest.mark.parametrize("schedule", [STEPS, RAMP], ids=["steps", "ramp"])
def test_locate_one_position_of_and_random_access_agree(schedule):
    bound = schedule.bind(len(schedule))
    comp, k = bound.locate(np.arange(500))
    assert [bound.locate_one(p) for p in range(500)] == list(zip(comp.tolist(), k.tolist()))
    for p in range(0, 500, 7):
        assert bound.position_of(int(comp[p]), int(k[p])) == p


@st.composite
def schedules(draw):
    count = draw(st.integers(1, 4))
    linear = draw(st.booleans())
    n_points = draw(st.integers(1, 5))
    gaps = draw(st.lists(st.integers(0 if linear else 1, 40), min_size=n_points - 1, max_size=n_points - 1))
    if linear:  # no three points at one position
        gaps = [g if g or i == 0 or gaps[i - 1] else 1 for i, g in enumerate(gaps)]
    ats = [0, *np.cumsum(gaps).tolist()]
    weight = st.one_of(st.just(0), st.integers(1, 9), st.floats(0.001, 10))
    points = []
    for at in ats:
        w = draw(st.lists(weight, min_size=count, max_size=count).filter(lambda ws: sum(ws) > 0))
        points.append((at, w))
    pieces = draw(st.integers(1, 12))
    return dl.WeightSchedule(points, interpolation="linear" if linear else "step",
                             elements_per_step=draw(st.integers(1, 5)), ramp_pieces=pieces)


@settings(max_examples=60, deadline=None)
@given(schedules())
def test_any_schedule_numbers_each_components_draws_and_locates_consistently(schedule):
    bound = schedule.bind(len(schedule))
    positions = np.arange(600)
    comp, k = bound.locate(positions)
    shuffled = np.random.default_rng(0).permutation(600)  # the order asked does not matter
    assert (bound.locate(shuffled)[0] == comp[shuffled]).all()
    for c in range(len(schedule)):
        ks = k[comp == c]
        assert ks.tolist() == list(range(len(ks)))
        if len(ks):
            assert bound.position_of(c, int(ks[-1])) == int(positions[comp == c][-1])
    piece = None  # the iterator-level mixtures walk the pieces' tables
    walked = []
    for p in range(600):
        if piece is None or (piece.stop is not None and p >= piece.stop):
            piece = bound.piece(p)
        walked.append(piece.component(p))
    assert walked == comp.tolist()
    for p in (0, 1, 77, 599):
        assert bound.locate_one(p) == (int(comp[p]), int(k[p]))
        assert bound.weights_at(p)[comp[p]] > 0  # never a component of weight 0 there


def test_each_step_piece_mixes_by_its_own_weights():
    schedule = dl.WeightSchedule({0: [1, 3], 100: [3, 1], 300: [1, 0]}, elements_per_step=10)
    comp = np.asarray(dl.MapDataset.mix(tagged(2), schedule)[:4000]) // 10**6
    assert comp[:1000].mean() == 0.75
    assert comp[1000:3000].mean() == 0.25
    assert comp[3000:].sum() == 0  # weight 0: left out from step 300 on


def test_a_linear_ramp_moves_the_share_in_steps_of_its_pieces():
    schedule = dl.WeightSchedule([(0, [1, 0]), (1000, [0, 1])], interpolation="linear", ramp_pieces=10)
    comp = np.asarray(dl.MapDataset.mix(tagged(2), schedule)[:1200]) // 10**6
    shares = [comp[i * 100:(i + 1) * 100].mean() for i in range(10)]
    assert np.allclose(shares, [0.05 + 0.1 * i for i in range(10)], atol=0.011)
    assert comp[1000:].min() == 1
    assert schedule.weights_at(250) == pytest.approx([0.75, 0.25])


def test_draws_before_counts_what_locate_finds():
    s = dl.MixSchedule([0.3, 0.7, 0.2])
    comp, _ = s.locate(np.arange(2000))
    for n in (0, 1, 7, 333, 1001, 2000):
        assert _draws_before(s.counts, n) == [int((comp[:n] == c).sum()) for c in range(3)]


def test_a_pass_ends_where_the_first_finite_component_runs_out():
    a, b = dl.MapDataset.range(10), dl.MapDataset.range(100, 200)
    mixed = dl.MapDataset.mix([a, b], dl.WeightSchedule([(0, [1, 0]), (5, [1, 1])]))
    got = list(mixed)
    assert len(mixed) == len(got) == 15  # 5 from a alone, then a's last 5 with 5 of b
    assert sorted(x for x in got if x < 100) == list(range(10))


@pytest.mark.parametrize("batch", [None, 4])
def test_map_dataset_mix_restores_at_every_step_around_the_switches(batch):
    ds = dl.MapDataset.mix([c.seed(c[0]).shuffle().repeat() for c in tagged(3, 7)], STEPS)
    stream = ds.to_iter_dataset() if batch is None else ds.batch(batch).to_iter_dataset()
    assert_restores_everywhere(lambda: iter(stream), limit=45 if batch is None else 12)


def test_a_ramp_restores_at_every_step_on_workers():
    ds = dl.MapDataset.mix([dl.MapDataset.range(20).repeat(), dl.MapDataset.range(100, 117).repeat()], RAMP)
    stream = ds.map(lambda x: x * 2).to_iter_dataset().mp_prefetch(dl.MultiprocessingOptions(num_workers=2))
    outputs = assert_restores_everywhere(lambda: iter(stream), limit=50)
    assert outputs == [x * 2 for x in ds[:50]]


def test_iter_dataset_mix_of_streams_and_of_named_streams_restore_around_the_switches():
    parts = [dl.MapDataset.range(c * 100, c * 100 + 40).to_iter_dataset() for c in range(3)]
    engine = dl.IterDataset.mix(parts, STEPS)
    assert type(engine).__name__ == "LoaderIterDataset"  # one engine, one position
    named_schedule = dl.WeightSchedule([(at, dict(zip("abc", w))) for at, w in
                                        [(0, [1, 0, 2]), (12, [1, 1, 1]), (30, [0.3, 0.7, 0.1])]])
    named = dl.IterDataset.mix(dict(zip("abc", parts)), named_schedule)
    assert type(named).__name__ == "MixIterDataset"
    expected = assert_restores_everywhere(lambda: iter(engine), limit=45)
    assert assert_restores_everywhere(lambda: iter(named), limit=45) == expected
    assert expected == list(dl.MapDataset.mix([dl.MapDataset.range(c * 100, c * 100 + 40) for c in range(3)], STEPS)[:45])


def elastic_run(save_after: int, schedule) -> list[int]:
    """Two hosts read ``save_after`` batches of 4 each, three hosts restored from their
    states read the rest of the pass (batches of 2 ... as the shards fall): every id used."""
    ds = dl.MapDataset.mix([dl.MapDataset.range(0, 60).seed(1).shuffle(),
                            dl.MapDataset.range(100, 150).seed(2).shuffle()], schedule)

    def host(h, count, batch):
        return iter(ds.to_iter_dataset(shard_options=dl.ShardOptions(h, count)).batch(batch))

    used: list[int] = []
    two = [host(h, 2, 4) for h in range(2)]
    for it in two:
        for batch in take(it, save_after):
            used += batch.tolist()
    states = [json.loads(json.dumps(it.get_state())) for it in two]
    for h in range(3):
        it = host(h, 3, 2)
        it.set_state(states)
        used += [x for batch in it for x in batch.tolist()]
    return used


@pytest.mark.parametrize("save_after", range(1, 8))
def test_an_elastic_restore_from_two_hosts_to_three_around_a_switch_uses_each_record_once(save_after):
    """The switch (at global position 24, in batches of 8 over 2 hosts: after batch 3) and
    the restore at every batch around it: the 3 hosts read what the 2 left, exactly."""
    schedule = dl.WeightSchedule([(0, [3, 1]), (3, [1, 2])], elements_per_step=8)
    ds = dl.MapDataset.mix([dl.MapDataset.range(0, 60).seed(1).shuffle(),
                            dl.MapDataset.range(100, 150).seed(2).shuffle()], schedule)
    used = elastic_run(save_after, schedule)
    assert sorted(used) == sorted(ds)  # the uninterrupted pass: each record once, none lost
    assert len(set(used)) == len(used)


def test_a_state_of_another_schedule_is_refused():
    def stream(schedule):
        return dl.MapDataset.mix(tagged(2), schedule).to_iter_dataset()

    it = iter(stream(dl.WeightSchedule([(0, [1, 1]), (10, [1, 2])])))
    next(it)
    other = iter(stream(dl.WeightSchedule([(0, [1, 1]), (11, [1, 2])])))
    with pytest.raises(dl.StateMismatchError, match=r"index_map=.*schedule"):
        other.set_state(it.get_state())


@pytest.mark.parametrize(("points", "kwargs", "error", "match"), [
    ([], {}, ValueError, r"needs at least one point \(0, weights\)"),
    ([(5, [1, 1])], {}, ValueError, r"first point must be at 0 .* got at=5; add \(0, weights\) first"),
    ([(0, [1, 1]), (10, [1, 2]), (10, [2, 1])], {}, ValueError,
     r"sorted by at, increasing: point 2 is at 10 after point 1 at 10"),
    ([(0, [1, 1]), (10, [1, 2]), (5, [2, 1])], {}, ValueError, r"point 2 is at 5 after point 1 at 10"),
    ([(0, [1, 1]), (10, [1, 2]), (10, [2, 1]), (10, [1, 1])], {"interpolation": "linear"}, ValueError,
     r"two equal in a row make a jump\): point 3 is at 10"),
    ([(0, [1, 1]), (10, [1, 2, 3])], {}, ValueError, r"point 1 has 3 weights, point 0 has 2"),
    ([(0, [1, -1])], {}, ValueError, r"point 0: weight 1 is -1; weights must be finite numbers >= 0"),
    ([(0, [1, float("nan")])], {}, ValueError, r"weight 1 is nan"),
    ([(0, [1, 1]), (4, [0, 0])], {}, ValueError, r"point 1 \(at 4\) has only zero weights"),
    ([(0, {"a": 1}), (4, {"b": 1})], {}, ValueError, r"point 1 has weights for \['b'\], point 0 for \['a'\]"),
    ([(0, [1, 1]), (4, {"a": 1, "b": 1})], {}, ValueError, r"point 0 for a list"),
    ([(0, {"a": 1}), (4, [1])], {}, TypeError, r"point 1: weights must be a list \(or a dict by name"),
    ([(-1, [1])], {}, ValueError, r"at must be an integer >= 0, got -1"),
    ([(0, [1])], {"interpolation": "cosine"}, ValueError, r"interpolation must be one of \['step', 'linear'\]"),
    ([(0, [1])], {"elements_per_step": 0}, ValueError, r"elements_per_step must be an integer >= 1, got 0"),
    ([5], {}, TypeError, r"point 0 is 5; write each as \(at, weights\)"),
])
def test_bad_schedules_are_refused_at_construction(points, kwargs, error, match):
    with pytest.raises(error, match=match):
        dl.WeightSchedule(points, **kwargs)


def test_a_schedule_that_does_not_match_the_datasets_is_refused_by_mix():
    schedule = dl.WeightSchedule([(0, [1, 1]), (4, [1, 2])])
    with pytest.raises(ValueError, match=r"MapDataset.mix: the WeightSchedule has 2 weights a point for 3 datasets"):
        dl.MapDataset.mix(tagged(3), schedule)
    parts = {k: dl.MapDataset.range(3).to_iter_dataset() for k in "ab"}
    with pytest.raises(ValueError, match=r"datasets are named \(\['a', 'b'\]\) but the WeightSchedule's weights are lists"):
        dl.IterDataset.mix(parts, schedule)
    named = dl.WeightSchedule([(0, {"a": 1, "c": 1})])
    with pytest.raises(ValueError, match=r"has weights for \['a', 'c'\], the datasets are \['a', 'b'\]"):
        dl.IterDataset.mix(parts, named)
    with pytest.raises(ValueError, match=r"weights by name \(\['a', 'c'\]\) but the datasets are a list"):
        dl.MapDataset.mix(tagged(2), named)


@pytest.mark.parametrize("save_after", [4, 6, 8])
def test_a_named_mixture_restores_elastically_from_two_hosts_to_three_around_a_switch(save_after):
    """The iterator-level mixture (a dict: MaxText's mixture file) counts this host's
    elements; restored from every old host's states, each component continues from its
    own states on all of them: no record twice, and what was left is read."""
    schedule = dl.WeightSchedule([(0, {"a": 1, "b": 0}), (6, {"a": 1, "b": 1})])

    def host(h, count):
        parts = {"a": dl.MapDataset.range(0, 40).to_iter_dataset(shard_options=dl.ShardOptions(h, count)),
                 "b": dl.MapDataset.range(100, 140).to_iter_dataset(shard_options=dl.ShardOptions(h, count))}
        return iter(dl.IterDataset.mix(parts, schedule))

    two = [host(h, 2) for h in range(2)]
    used = [x for it in two for x in take(it, save_after)]
    states = [json.loads(json.dumps(it.get_state())) for it in two]
    three = [host(h, 3) for h in range(3)]
    for it in three:
        it.set_state(states)
        used += list(it)
    assert len(used) == len(set(used))
    assert set(range(0, 40)) <= set(used)  # a ran out last on some host: all of it was read
    fresh = host(0, 3)
    fresh.set_state(states)
    assert fresh.get_state()["position"] == save_after  # the old hosts' mean
