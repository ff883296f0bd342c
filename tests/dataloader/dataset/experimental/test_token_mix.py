"""IterDataset.mix(weight_by="tokens"): shares of tokens, restores (also elastic), errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

import dataloader as dl
from tests.dataloader.dataset.experimental.streams import Counted
from tests.helpers import assert_restores_everywhere, take

# Component c's element k is c * 10**6 + k; its length is a pseudo-random function of
# the element, with a very different spread per component (1-64, 100-2,047, 8-512).
SPANS = [(1, 64), (100, 2048), (8, 513)]


def length(element: int) -> int:
    c, k = divmod(int(element), 10**6)
    low, high = SPANS[c]
    return low + (k * 2654435761 + c * 97) % (high - low)


def components(n_each: int = 10**6, shard: dl.ShardOptions | None = None):
    return [dl.MapDataset.range(c * 10**6, c * 10**6 + n_each).to_iter_dataset(shard_options=shard)
            for c in range(len(SPANS))]


def shares(elements: list[int]) -> np.ndarray:
    tokens = np.zeros(len(SPANS))
    for e in elements:
        tokens[e // 10**6] += length(e)
    return tokens / tokens.sum()


def test_each_components_share_of_a_million_tokens_is_within_one_percent_of_its_weight():
    weights = [0.2, 0.3, 0.5]
    it = iter(dl.IterDataset.mix(components(), weights, weight_by="tokens", length=length))
    seen, total = [], 0
    while total < 2_000_000:
        seen.append(next(it))
        total += length(seen[-1])
    # every window of about a million tokens, starting at several points
    ends = np.cumsum([length(e) for e in seen])
    for start_tokens in (0, 250_000, 500_000, 999_000):
        i = int(np.searchsorted(ends, start_tokens))
        j = int(np.searchsorted(ends, start_tokens + 1_000_000))
        assert np.abs(shares(seen[i:j]) - weights).max() < 0.01
    # by element counts the shares are far from the weights (what weight_by fixes)
    counts = np.bincount(np.asarray(seen) // 10**6) / len(seen)
    assert np.abs(counts - weights).max() > 0.3


def test_a_token_schedule_switches_shares_at_a_token_count():
    schedule = dl.WeightSchedule([(0, [1, 0, 1]), (200_000, [0, 1, 1])])
    it = iter(dl.IterDataset.mix(components(), schedule, weight_by="tokens", length=length))
    seen, ends = [], []
    while not ends or ends[-1] < 400_000:
        seen.append(next(it))
        ends.append((ends[-1] if ends else 0) + length(seen[-1]))
    cut = int(np.searchsorted(ends, 200_000))
    before, after = shares(seen[:cut]), shares(seen[cut + 1:])
    assert before[1] == 0 and abs(before[0] - 0.5) < 0.01
    assert after[0] == 0 and abs(after[1] - 0.5) < 0.02


def test_a_token_mixture_restores_at_every_step_around_a_switch():
    schedule = dl.WeightSchedule([(0, [1, 1, 0]), (3_000, [1, 1, 2])])
    mixed = dl.IterDataset.mix(components(200), schedule, weight_by="tokens", length=length)
    outputs = assert_restores_everywhere(lambda: iter(mixed), limit=40)
    ends = np.cumsum([length(e) for e in outputs])
    assert ends[0] < 3_000 < ends[-1]  # the switch is among the steps restored
    assert {e // 10**6 for e in outputs[:int(np.searchsorted(ends, 3_000))]} <= {0, 1}


def test_named_token_mixtures_keep_states_by_name_and_restore_at_every_step():
    parts = {"a": Counted(list(range(0, 60))), "b": dl.MapDataset.range(10**6, 10**6 + 60).to_iter_dataset()}
    mixed = dl.IterDataset.mix(parts, {"a": 1, "b": 1}, weight_by="tokens", length=length)
    assert_restores_everywhere(lambda: iter(mixed), limit=50)
    it = iter(mixed)
    take(it, 10)
    state = it.get_state()
    assert set(state["tokens"]) == {"a", "b"} and set(state["parents"]) == {"a", "b"}


WEIGHTS = [0.2, 0.3, 0.5]
MAX_LENGTH = max(high for _, high in SPANS) - 1


def token_host(h: int, count: int, n_each: int = 10**6):
    return iter(dl.IterDataset.mix(components(n_each, dl.ShardOptions(h, count)), WEIGHTS,
                                   weight_by="tokens", length=length))


def job_tokens(states: list) -> np.ndarray:
    return np.sum([s["tokens"] for s in states], axis=0)


@pytest.mark.parametrize("save_after", [1, 5, 9])
def test_an_elastic_restore_from_two_hosts_to_three_uses_each_record_at_most_once(save_after):
    used = []
    two = [token_host(h, 2, 60) for h in range(2)]
    for it in two:
        used += take(it, save_after)
    states = [json.loads(json.dumps(it.get_state())) for it in two]
    three = [token_host(h, 3, 60) for h in range(3)]
    for it in three:
        it.set_state(states)
        used += list(it)  # to where the first component runs out on that host
    assert len(set(used)) == len(used)  # no record twice
    # the components continued from where the old hosts stopped: nobody read a record
    # below what the two hosts had used, twice, and the mixture drew on every component
    assert {e // 10**6 for e in used} == {0, 1, 2}


@pytest.mark.parametrize(("old", "new"), [(2, 3), (3, 1), (2, 2)])
def test_an_elastic_restore_splits_the_jobs_token_counts_exactly_over_the_new_hosts(old, new):
    """The new hosts' counts sum to the old hosts' (nothing lost or gained, whatever the
    host counts), each new host's an equal share (to one token), and the job's shares
    over the whole run stay within (old + new) * max_length / T of the weights."""
    hosts = [token_host(h, old) for h in range(old)]
    used = [x for it in hosts for x in take(it, 40 + 7 * hosts.index(it))]  # hosts unequal
    states = [json.loads(json.dumps(it.get_state())) for it in hosts]
    restored = [token_host(h, new) for h in range(new)]
    for it in restored:
        it.set_state(states)
    after = [it.get_state() for it in restored]
    assert job_tokens(after).tolist() == job_tokens(states).tolist()
    for c in range(len(WEIGHTS)):
        shares_c = [s["tokens"][c] for s in after]
        assert max(shares_c) - min(shares_c) <= 1
    for it in restored:
        used += take(it, 300)
    assert len(set(used)) == len(used)  # every record at most once
    counted = np.zeros(len(WEIGHTS))
    for e in used:
        counted[e // 10**6] += length(e)
    # the states count exactly the tokens of the records the hosts handed out
    assert job_tokens([it.get_state() for it in restored]).tolist() == counted.astype(int).tolist()
    error = np.abs(counted / counted.sum() - WEIGHTS).max()
    assert error <= (old + new) * MAX_LENGTH / counted.sum()


def test_a_token_schedules_switch_comes_at_the_jobs_token_count_whatever_the_host_count():
    schedule = dl.WeightSchedule([(0, [1, 0, 1]), (100_000, [0, 1, 1])])

    def first_of_component_1(count: int) -> int:
        """The job's tokens (summed over the hosts) before any host draws component 1."""
        hosts = [iter(dl.IterDataset.mix(components(10**6, dl.ShardOptions(h, count)), schedule,
                                         weight_by="tokens", length=length)) for h in range(count)]
        job = 0
        while True:
            for it in hosts:
                element = next(it)
                if element // 10**6 == 1:
                    return job
                job += length(element)

    for count in (1, 2, 4):
        assert 100_000 - count * MAX_LENGTH <= first_of_component_1(count) <= 100_000 + count * MAX_LENGTH


def test_many_components_are_compared_in_numpy_with_the_same_choices(monkeypatch):
    from dataloader.dataset.experimental import token_mix

    def first(n):
        parts = {f"s{c:02d}": dl.MapDataset.range(c * 10**6, c * 10**6 + 50).to_iter_dataset() for c in range(40)}
        weights = {k: 1 + i % 5 for i, k in enumerate(parts)}
        it = iter(dl.IterDataset.mix(parts, weights, weight_by="tokens", length=lambda e: 1 + e % 13))
        return take(it, n)

    vectorised = first(300)
    monkeypatch.setattr(token_mix, "_VECTOR_FROM", 10**6)
    assert first(300) == vectorised


def test_weight_by_tokens_needs_a_length_function_and_checks_its_answers():
    parts = components(10)
    with pytest.raises(TypeError, match=r"weight_by='tokens'\) needs length=, a function of an element"):
        dl.IterDataset.mix(parts, weight_by="tokens")
    with pytest.raises(ValueError, match=r"weight_by must be 'elements' or 'tokens', got 'bytes'"):
        dl.IterDataset.mix(parts, weight_by="bytes")
    with pytest.raises(ValueError, match=r"length= counts tokens for weight_by='tokens'"):
        dl.IterDataset.mix(parts, length=len)
    with pytest.raises(ValueError, match=r"weights\[1\] is 0"):
        dl.IterDataset.mix(parts, [1, 0, 1], weight_by="tokens", length=length)
    it = iter(dl.IterDataset.mix(parts, weight_by="tokens", length=lambda e: -1))
    with pytest.raises(ValueError, match=r"length\(element\) must be an integer >= 0, got -1 for an element of component 0"):
        next(it)


def test_a_state_of_another_number_of_components_is_refused():
    it = iter(dl.IterDataset.mix(components(10), weight_by="tokens", length=length))
    next(it)
    other = iter(dl.IterDataset.mix(components(10)[:2], weight_by="tokens", length=length))
    with pytest.raises(dl.StateMismatchError, match=r"the mixture has 2 components"):
        other.set_state(it.get_state())
