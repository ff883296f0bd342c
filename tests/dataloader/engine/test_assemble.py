"""The assemblers' output and states do not depend on how the stream is cut into units.

Unit sizes are forced from a seeded random choice (the sizer's policy is tested with
injected costs in test_sizing.py); the reference is the same loader with fixed units of
the grid's size, as every loader had before units were sized by cost.
"""

from __future__ import annotations

import numpy as np
import pytest

import dataloader as dl
from tests.dataloader.engine.forced_sizes import MIXED, fixed, force_sizes, run
from tests.dataloader.pipelines import make_loader
from tests.helpers import assert_streams_equal, assert_tree_equal

UNBATCHED_OR_REGROUPED = [
    "no_ops", "map", "filter", "flat_map", "random_map", "filter_batch", "flat_map_batch_drop",
    "everything", "filter_batch_then_flat_map",
]
SIZES = {
    "ones": [1],
    "small": [1, 2, 3, 5],
    "mixed": MIXED,
    "large": [7, 128, 256, 1000],
}


@pytest.mark.parametrize("sizes", SIZES)
@pytest.mark.parametrize("name", UNBATCHED_OR_REGROUPED)
def test_every_element_and_state_is_that_of_fixed_units(name, sizes, monkeypatch):
    kw = {"n": 150, "epochs": 3}
    want_out, want_states = run(fixed(name, **kw))
    force_sizes(monkeypatch, SIZES[sizes])
    got_out, got_states = run(make_loader(name, **kw))
    assert_streams_equal(got_out, want_out)
    assert got_states == want_states


@pytest.mark.parametrize("name", ["filter", "flat_map", "everything", "filter_batch_then_flat_map"])
def test_restoring_anywhere_with_other_unit_sizes_continues_as_fixed_units_do(name, monkeypatch):
    kw = {"n": 150, "epochs": 2}
    want_out, want_states = run(fixed(name, **kw))
    for k in range(0, len(want_out), 11):
        force_sizes(monkeypatch, SIZES["mixed"], seed=k)
        got_out, got_states = run(make_loader(name, **kw), want_states[k])
        assert_streams_equal(got_out, want_out[k:])
        assert got_states == want_states[k:], f"restored at step {k}"


def test_an_endless_stream_has_the_states_of_fixed_units(monkeypatch):
    kw = {"n": 50, "epochs": None}
    ref = iter(fixed("flat_map", **kw))
    want = [(next(ref), ref.get_state()) for _ in range(400)]
    ref.close()
    force_sizes(monkeypatch, SIZES["mixed"])
    it = iter(make_loader("flat_map", **kw))
    for i, (x, state) in enumerate(want):
        assert_tree_equal(next(it), x)
        assert it.get_state() == state, f"step {i}"
    it.close()


def test_an_explicit_unit_size_is_every_units_size():
    loader = make_loader("filter", n=100, epochs=1, read_options=dl.ReadOptions(unit_size=16))
    assert not loader.plan.adaptive
    assert list(loader.plan.units(0))[:3] == [(0, 16), (16, 32), (32, 48)]
    assert list(loader.plan.units(20))[:2] == [(20, 32), (32, 48)]


def test_by_default_an_unbatched_stream_starts_with_a_one_position_unit():
    loader = make_loader("map", n=1000, epochs=1)
    assert loader.plan.adaptive and loader.plan.unit_size == 128
    assert next(loader.plan.units(0)) == (0, 1)
    assert next(loader.plan.units(300)) == (300, 301)


def test_the_batch_layout_keeps_one_batch_a_unit():
    loader = make_loader("batch", n=100, epochs=1)
    assert not loader.plan.adaptive
    assert list(loader.plan.units(0))[:2] == [(0, 4), (4, 8)]


def test_the_first_element_computes_one_record(monkeypatch):
    """The first next() of an unbatched stream reads one record, not 128."""
    reads: list[int] = []

    class Counting(dl.RangeDataSource):
        def __getitems__(self, keys):
            reads.extend(int(k) for k in keys)
            return [int(k) for k in keys]

        def __getitem__(self, key):
            return self.__getitems__([key])[0]

    loader = dl.DataLoader(data_source=Counting(1000), sampler=dl.SequentialSampler(1000), operations=[])
    it = iter(loader)
    assert next(it) == 0
    assert reads == [0]
    it.close()


def raise_on_12(x: int) -> int:
    if x == 12:
        raise ZeroDivisionError("record 12 is cursed")
    return x


def test_an_error_met_by_get_state_looking_ahead_is_raised_by_the_next_call(monkeypatch):
    force_sizes(monkeypatch, [1])
    loader = dl.DataLoader(
        data_source=dl.RangeDataSource(100), sampler=dl.SequentialSampler(100),
        operations=[dl.MapTransform(raise_on_12), dl.FilterTransform(lambda x: x < 5 or x > 50)],
    )
    it = iter(loader)
    assert [next(it) for _ in range(5)] == [0, 1, 2, 3, 4]
    # The next output would come after record 12's unit, which fails: get_state() says
    # where the stream stands without raising, and next() raises at the failing record.
    assert it.get_state()["position"] == 12
    with pytest.raises(dl.PipelineError, match=r"record 12 .*ZeroDivisionError: record 12 is cursed"):
        next(it)
    it.close()


def test_looking_ahead_does_not_skip_or_repeat_an_output(monkeypatch):
    force_sizes(monkeypatch, [1])
    loader = dl.DataLoader(
        data_source=dl.RangeDataSource(300), sampler=dl.SequentialSampler(300),
        operations=[dl.FilterTransform(lambda x: x % 50 == 0)],
    )
    it = iter(loader)
    out, states = [], []
    for x in it:
        states.append(it.get_state()["position"])
        states.append(it.get_state()["position"])  # asking twice changes nothing
        out.append(x)
    assert out == [0, 50, 100, 150, 200, 250]
    # The next output's position when it is in the same grid block, else the grid line.
    assert states[::2] == [50, 100, 128, 200, 250, 256]
    assert np.array_equal(states[::2], states[1::2])


def test_default_units_grow_as_the_executor_reports_cheap_units():
    from types import SimpleNamespace

    units = make_loader("map", n=10**6, epochs=1).plan.units(0)
    got = []
    for _ in range(14):
        start, stop = next(units)
        got.append(stop - start)
        units.observe(SimpleNamespace(start=start, stop=stop, began=0.0, ended=1e-6 * (stop - start), outputs=[1]))
    # Doubling inside the first grid block (cut at its line), then whole blocks to the cap.
    assert got == [1, 2, 4, 8, 16, 32, 64, 1, 256, 512, 1024, 2048, 2048, 2048]


def keep_tenth_of_the_first_thousand(x: int) -> bool:
    return x >= 1000 or x % 10 == 0


@pytest.mark.parametrize("sizes", ["ones", "mixed", "large"])
def test_filter_thresholds_count_windows_of_1000_records_whatever_the_units(sizes, monkeypatch):
    """The first 1000 records lose 90 %: exactly the raise threshold, on every unit sizing
    (windows that closed on unit boundaries, 1024 records with fixed units, did not raise)."""
    from dataloader import experimental as ge

    force_sizes(monkeypatch, SIZES[sizes])
    ds = dl.MapDataset.range(3000).to_iter_dataset().filter(keep_tenth_of_the_first_thousand)
    strict = ge.WithOptionsIterDataset(ds, ge.DatasetOptions(filter_raise_threshold_ratio=0.9))
    with pytest.raises(ValueError, match=r"skipped 90.00 % of the last seen 1000 elements"):
        list(strict)
