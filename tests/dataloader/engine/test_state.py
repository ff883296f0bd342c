"""A state refuses a loader it does not fit, and restores elastically where it can."""

from __future__ import annotations

import json

import numpy as np
import pytest

import dataloader as dl
from tests.helpers import assert_streams_equal


def loader(n=40, seed=1, shard=(0, 1), batch=4, ops=None, shuffle=True):
    ops = ops if ops is not None else [dl.MapTransform(lambda x: x), dl.Batch(batch)]
    sampler = dl.IndexSampler(n, shard_options=dl.ShardOptions(*shard), shuffle=shuffle, seed=seed)
    return dl.DataLoader(dl.RangeDataSource(100), sampler, ops)


def state_after(ld, steps):
    it = iter(ld)
    for _ in range(steps):
        next(it)
    return it.get_state()


@pytest.mark.parametrize(("other", "message"), [
    (lambda: loader(n=50), r"num_records=40 but this loader has num_records=50 \(restore into a loader over the same data"),
    (lambda: loader(seed=2), r"seed=1 but this loader has seed=2"),
    (lambda: loader(shuffle=False, seed=1), r"shuffle=True but this loader has shuffle=False"),
    (lambda: loader(ops=[dl.MapTransform(abs), dl.Batch(4)]), r"operations=\[.*MapTransform\(.*<lambda>\).*\] but this loader has operations=\[.*MapTransform\(abs\)"),
])
def test_state_refuses_a_loader_it_was_not_made_for(other, message):
    state = state_after(loader(), 3)
    with pytest.raises(dl.StateMismatchError, match=message):
        iter(other()).set_state(state)


def test_state_refuses_another_shard_index():
    state = state_after(loader(shard=(0, 2)), 2)
    with pytest.raises(dl.StateMismatchError, match=r"shard_index=0 but this loader is shard 1"):
        iter(loader(shard=(1, 2))).set_state(state)


def test_state_refuses_a_different_global_batch_and_says_which_fits():
    state = state_after(loader(shard=(0, 2), batch=4), 2)
    with pytest.raises(dl.StateMismatchError, match=r"the global batch must stay the same, so use batch_size=2 on 4 shards"):
        iter(loader(shard=(0, 4), batch=4)).set_state(state)


def test_elastic_restore_is_refused_with_a_filter_before_the_batch():
    ops = lambda b: [dl.FilterTransform(lambda x: x % 2 == 0), dl.Batch(b)]  # noqa: E731
    state = state_after(loader(shard=(0, 2), ops=ops(4)), 2)
    with pytest.raises(dl.StateMismatchError, match=r"needs a plain Batch with no filter or flat map before it"):
        iter(loader(shard=(0, 1), ops=ops(8))).set_state(state)


def test_mismatch_is_refused_at_construction_of_an_iterator_from_a_state():
    state = state_after(loader(), 1)
    with pytest.raises(dl.StateMismatchError, match=r"num_records=40"):
        loader(n=41).iterator(state)


def test_garbage_and_future_versions_are_refused():
    with pytest.raises(dl.StateMismatchError, match=r"expected a state dict from get_state\(\), got list"):
        iter(loader()).set_state([1, 2])
    state = state_after(loader(), 1)
    state["version"] = 99
    with pytest.raises(dl.StateMismatchError, match=r"state version 99 is not supported"):
        iter(loader()).set_state(state)


def test_num_epochs_may_grow_between_save_and_restore():
    short = dl.DataLoader(dl.RangeDataSource(10), dl.IndexSampler(10, shuffle=True, seed=3, num_epochs=1), [dl.Batch(5)])
    longer = dl.DataLoader(dl.RangeDataSource(10), dl.IndexSampler(10, shuffle=True, seed=3, num_epochs=3), [dl.Batch(5)])
    state = state_after(short, 2)
    it = longer.iterator(state)
    rest = [b.tolist() for b in it]
    assert rest == [b.tolist() for b in longer][2:]


@pytest.mark.parametrize(("h0", "h1"), [(2, 1), (2, 4), (4, 2), (1, 2)])
def test_elastic_restore_keeps_the_global_batches(h0, h1):
    global_batch = 8

    def shard_batches(h_count, state=None, steps=None):
        per = []
        for h in range(h_count):
            ld = loader(n=37, shard=(h, h_count), batch=global_batch // h_count)
            it = ld.iterator(state) if state is not None else iter(ld)
            per.append([set(next(it).tolist()) for _ in range(steps)])
        return per

    def global_batches(per):
        return [set().union(*(p[k] for p in per)) for k in range(len(per[0]))]

    reference = global_batches(shard_batches(1, steps=12))
    before = shard_batches(h0, steps=5)
    assert global_batches(before) == reference[:5]
    # Every host's state is at the same local position; restore from host 0's.
    ld0 = loader(n=37, shard=(0, h0), batch=global_batch // h0)
    it0 = iter(ld0)
    for _ in range(5):
        next(it0)
    after = shard_batches(h1, state=it0.get_state(), steps=7)
    assert global_batches(after) == reference[5:]


def test_elastic_restore_maps_the_position():
    state = state_after(loader(shard=(0, 2), batch=4), 3)
    assert state["position"] == 12
    it = loader(shard=(1, 4), batch=2).iterator(state)
    assert it.get_state()["position"] == 6


def test_restored_iterator_continues_identically_after_epoch_boundary():
    ld = dl.DataLoader(dl.RangeDataSource(12), dl.IndexSampler(12, shuffle=True, seed=9, num_epochs=4), [dl.Batch(4)])
    full = list(ld)
    state = state_after(ld, 3)  # exactly one epoch
    assert state["position"] == 12
    assert_streams_equal(list(ld.iterator(state)), full[3:])
    assert np.array_equal(np.sort(np.concatenate(full[:3])), np.arange(12))


# --- tampered states: every field is checked before anything restores -------------------


def _tampered(**changes):
    state = state_after(loader(), 2)
    for key, value in changes.items():
        if key.startswith("made_for."):
            state["made_for"][key.split(".", 1)[1]] = value
        else:
            state[key] = value
    return state


@pytest.mark.parametrize(("field", "value", "message"), [
    ("position", "5", r"state field position='5' is invalid: expected an integer >= 0"),
    ("position", True, r"state field position=True is invalid: expected an integer >= 0"),
    ("position", 30.5, r"state field position=30.5 is invalid: expected an integer >= 0"),
    ("position", "abc", r"state field position='abc' is invalid: expected an integer >= 0"),
    ("position", -10, r"state field position=-10 is invalid: expected an integer >= 0"),
    ("position", None, r"state field position=None is invalid"),
    ("sub_index", -1, r"state field sub_index=-1 is invalid: expected an integer >= 0"),
    ("skip", "0", r"state field skip='0' is invalid: expected an integer >= 0"),
    ("version", True, r"state version True is not supported \(expected 1\)"),
    ("made_for.shard_count", 0, r"made_for.shard_count=0 is invalid: expected an integer >= 1"),
    ("made_for.batch_size", "4", r"made_for.batch_size='4' is invalid: expected an integer >= 1 or null"),
    ("made_for.seed", True, r"made_for.seed=True is invalid: expected an integer or null"),
    ("made_for.shuffle", 1, r"made_for.shuffle=1 is invalid: expected true or false"),
    ("made_for.shard_index", 3, r"made_for.shard_index=3 is invalid: expected < shard_count=1"),
    ("made_for.layout", "rows", r"made_for.layout='rows' is invalid: expected one of batch, elements, regroup"),
    ("made_for.operations", "Batch(4)", r"made_for.operations='Batch\(4\)' is invalid: expected a list of operation names"),
    ("made_for", {}, r"state field made_for misses num_records, shuffle, seed, .* operations; expected the keys"),
    ("made_for", [1], r"state field made_for=\[1\] is invalid: expected a dict"),
])
def test_a_tampered_field_is_refused_naming_field_value_and_expectation(field, value, message):
    state = _tampered(**{field: value})
    with pytest.raises(dl.StateMismatchError, match=message):
        iter(loader()).set_state(state)
    with pytest.raises(dl.StateMismatchError, match=message):
        loader().iterator(state)


def test_unknown_and_missing_keys_are_refused_by_name():
    state = _tampered(extra=1)
    with pytest.raises(dl.StateMismatchError, match=r"the state has unknown keys extra; expected the keys version, position"):
        iter(loader()).set_state(state)
    state = state_after(loader(), 2)
    del state["skip"]
    with pytest.raises(dl.StateMismatchError, match=r"the state misses skip"):
        iter(loader()).set_state(state)
    state = state_after(loader(), 2)
    del state["made_for"]["shard_count"]
    with pytest.raises(dl.StateMismatchError, match=r"state field made_for misses shard_count"):
        iter(loader()).set_state(state)
    state = _tampered(**{"made_for.colour": "red"})
    with pytest.raises(dl.StateMismatchError, match=r"made_for has unknown keys colour"):
        iter(loader()).set_state(state)


@pytest.mark.parametrize("cut", [lambda t: t[: len(t) // 2], lambda t: t.encode()[:30], lambda t: "", lambda t: b"\xff\xfe"])
def test_malformed_json_is_refused_with_what_was_expected(cut):
    text = json.dumps(state_after(loader(), 2))
    with pytest.raises(dl.StateMismatchError, match=r"the state is not valid JSON \(.*\).*; pass the dict get_state\(\) returned or json.dumps of it"):
        iter(loader()).set_state(cut(text))


def test_json_text_and_grain_style_bytes_are_accepted():
    state = state_after(loader(), 2)
    expected = next(loader().iterator(state)).tolist()
    assert next(loader().iterator(json.dumps(state))).tolist() == expected
    assert next(loader().iterator(json.dumps(state).encode())).tolist() == expected


def test_a_position_past_the_end_of_a_finite_stream_is_refused_at_set_state():
    finite = dl.DataLoader(dl.RangeDataSource(10), dl.IndexSampler(10, shuffle=True, seed=3, num_epochs=3), [dl.Batch(5)])
    one_epoch = dl.DataLoader(dl.RangeDataSource(10), dl.IndexSampler(10, shuffle=True, seed=3, num_epochs=1), [dl.Batch(5)])
    state = state_after(finite, 4)  # position 20, in the third epoch
    with pytest.raises(dl.StateMismatchError, match=r"position=20 is invalid: expected a position within this loader's stream, which ends at position 10"):
        one_epoch.iterator(state)
    at_end = state_after(one_epoch, 2)  # the end itself is a valid state: nothing follows
    assert at_end["position"] == 10 and list(one_epoch.iterator(at_end)) == []


@pytest.mark.parametrize(("shards", "last"), [(1, 2**63 - 1), (3, (2**63 - 1 - 2) // 3)])
@pytest.mark.parametrize("beyond", [1, 2**63, 2**64])
def test_a_position_an_endless_stream_cannot_reach_is_refused_at_set_state(shards, last, beyond):
    """Global positions are int64: past the last one, set_state refuses, naming the range,
    rather than the first next() failing with an OverflowError."""
    endless = dl.DataLoader(
        dl.RangeDataSource(10), dl.IndexSampler(10, dl.ShardOptions(shards - 1, shards), shuffle=True, seed=3),
        [dl.Batch(2)],
    )
    state = state_after(endless, 1)
    state["position"] = last + beyond
    with pytest.raises(
        dl.StateMismatchError,
        match=rf"position={last + beyond} is invalid: expected a position in \[0, {last}\]: this loader's stream "
        r"repeats for ever, but its global positions are 64-bit integers",
    ):
        iter(endless).set_state(state)
    state["position"] = last  # the last position itself still gives its record
    it = iter(endless)
    it.set_state(state)
    assert len(next(it)) == 1


def test_sub_index_and_skip_are_refused_where_the_pipeline_cannot_make_them():
    with pytest.raises(dl.StateMismatchError, match=r"sub_index=1 is invalid: expected 0: no flat map comes before the batch"):
        iter(loader()).set_state(_tampered(sub_index=1))
    with pytest.raises(dl.StateMismatchError, match=r"skip=2 is invalid: expected 0: no operation follows the batch"):
        iter(loader()).set_state(_tampered(skip=2))
