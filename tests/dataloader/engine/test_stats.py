"""stats() on every iterator: one shape, counts that mean what they say, the window, hooks."""

from __future__ import annotations

import json
import logging
import time

import numpy as np
import pytest

import dataloader as dl
from dataloader.engine.stats import clock as stats_clock
from dataloader.engine.stats.protocol import StatsParticipant
from dataloader.engine.stats.shape import flatten
from dataloader.engine.stats.units import LOG_UNITS, Stats

TOP_KEYS = {
    "records_read", "elements_out", "batches_out", "units", "pipe_units", "wait_s", "fetch_cpu_s",
    "stage_seconds", "workers", "records_per_s", "elements_per_s", "batches_per_s", "wait_share",
    "elapsed_s", "active_s", "first_next_s", "window", "pipeline", "queues",
}
WINDOW_KEYS = TOP_KEYS - {"elapsed_s", "active_s", "first_next_s", "window", "pipeline", "queues"} | {"seconds"}


def slow(x):
    time.sleep(0.002)
    return x


def keep_odd(x):
    return x % 2 == 1


def twice(x):
    return [x, x]


def tokens(i):
    return {"tokens": np.arange(1 + i % 5, dtype=np.int32)}


def assert_shape(stats):
    assert set(stats) == TOP_KEYS, set(stats) ^ TOP_KEYS
    assert set(stats["window"]) == WINDOW_KEYS, set(stats["window"]) ^ WINDOW_KEYS
    for entry in stats["workers"].values():
        assert set(entry) == {"busy_s", "cpu_s", "units", "span_s", "busy_share"}
    json.dumps(stats)  # stats.json, hooks: plain JSON values only


def test_loader_counts_records_read_elements_out_and_batches_out_apart():
    loader = dl.DataLoader(dl.RangeDataSource(100), dl.SequentialSampler(100),
                           [dl.FilterTransform(keep_odd), dl.FlatMapTransform(twice), dl.Batch(8)])
    it = iter(loader)
    batches = list(it)
    stats = it.stats()
    assert_shape(stats)
    assert stats["records_read"] == 100
    assert stats["elements_out"] == 100 == sum(len(b) for b in batches)  # 50 kept, each twice
    assert stats["batches_out"] == len(batches) == 13


def test_a_plain_batch_counts_rows_and_batches():
    it = iter(dl.DataLoader(dl.RangeDataSource(50), dl.SequentialSampler(50), [dl.Batch(8, drop_remainder=True)]))
    assert len(list(it)) == 6
    stats = it.stats()
    assert (stats["records_read"], stats["elements_out"], stats["batches_out"], stats["units"]) == (48, 48, 6, 6)


def test_without_a_batch_elements_out_are_the_outputs_and_no_batch_is_counted():
    it = iter(dl.DataLoader(dl.RangeDataSource(30), dl.SequentialSampler(30), [dl.FilterTransform(keep_odd)]))
    assert len(list(it)) == 15
    stats = it.stats()
    assert (stats["records_read"], stats["elements_out"], stats["batches_out"]) == (30, 15, 0)


def test_seconds_per_stage_name_each_operation_and_the_consumer_waits_for_them():
    loader = dl.DataLoader(dl.RangeDataSource(40), dl.SequentialSampler(40), [dl.MapTransform(slow), dl.Batch(8)])
    it = iter(loader)
    list(it)
    stats = it.stats()
    stages = stats["stage_seconds"]
    assert set(stages) == {"read", "MapTransform(slow)", "batch"}
    assert stages["MapTransform(slow)"] >= 0.08
    # In this process the consumer computes every unit itself: it waits the whole time.
    # The first next() (the first unit) is start-up, apart from the waiting.
    assert stats["first_next_s"] + stats["wait_s"] >= stages["MapTransform(slow)"]
    # Lower bounds only (a sleep never ends early; on a loaded machine it ends late): the
    # first unit's 8 records are start-up, the other 4 units' 32 are waiting.
    assert stats["first_next_s"] >= 0.016 and stats["wait_s"] >= 0.064
    assert stats["wait_share"] > 0.8
    assert set(stats["workers"]) == {"main"}
    assert stats["workers"]["main"]["units"] == 5
    assert stats["workers"]["main"]["busy_s"] >= 0.08


def test_stats_before_the_first_next_are_zeros_of_the_same_shape():
    it = iter(dl.DataLoader(dl.RangeDataSource(10), dl.SequentialSampler(10), [dl.Batch(2)]))
    stats = it.stats()
    assert_shape(stats)
    assert stats["records_read"] == stats["batches_out"] == stats["units"] == 0
    assert stats["active_s"] == 0 and stats["records_per_s"] == 0


def test_pipeline_section_says_what_the_rules_need():
    loader = dl.DataLoader(dl.RangeDataSource(64), dl.IndexSampler(64, shuffle=True, seed=1),
                           [dl.MapTransform(slow), dl.Batch(16)], read_options=dl.ReadOptions(num_threads=2))
    pipeline = iter(loader).stats()["pipeline"]
    assert pipeline["source"] == "RangeDataSource" and pipeline["shuffle"] is True
    assert pipeline["batch_size"] == 16 and pipeline["worker_count"] == 0 and pipeline["read_threads"] == 2
    assert pipeline["operations"] == ["MapTransform(slow)", "Batch(16, drop_remainder=False)"]


def test_iterator_level_stages_report_their_own_seconds_and_their_outputs():
    ds = dl.MapDataset.range(60).map(tokens).to_iter_dataset()
    rows = dl.experimental.FirstFitPackIterDataset(ds, length_struct={"tokens": 8}, num_packing_bins=2)
    it = iter(rows.map(slow).batch(4))
    batches = list(it)
    stats = it.stats()
    assert_shape(stats)
    rows_out = sum(len(b["tokens"]) for b in batches)
    assert stats["records_read"] == 60
    assert stats["elements_out"] == rows_out and stats["batches_out"] == len(batches)
    stages = stats["stage_seconds"]
    assert stages["MapTransform(slow)"] >= 0.002 * rows_out  # the map after the packer
    assert "FirstFitPack" in " ".join(stages) and "read" in stages
    # The map's seconds are its own: the packer's and the engine's are not in them.
    assert stages["MapTransform(slow)"] < stats["first_next_s"] + stats["wait_s"]
    assert stats["pipeline"]["stages"][-1] == "Batch(4, drop_remainder=False)"


def test_a_prefetch_thread_is_not_a_stage_and_the_work_behind_it_keeps_its_name():
    ds = dl.MapDataset.range(30).to_iter_dataset().map(slow)
    it = iter(dl.experimental.ThreadPrefetchIterDataset(ds, prefetch_buffer_size=2))
    assert len(list(it)) == 30
    stages = it.stats()["stage_seconds"]
    assert stages["MapTransform(slow)"] >= 0.05
    assert not any("Prefetch" in name for name in stages)
    it.close()


class Doubled(dl.DatasetIterator):
    """A user's iterator whose __next__ calls its base class's."""

    def __init__(self, parent):
        super().__init__(parent)

    def __next__(self):
        return next(self._parent) * 2

    def get_state(self):
        return self._parent.get_state()

    def set_state(self, state):
        self._parent.set_state(state)


class Tripled(Doubled):
    def __next__(self):
        return super().__next__() * 3 // 2


def test_a_users_iterator_is_timed_and_counted_once_even_through_super():
    base = dl.MapDataset.range(12).to_iter_dataset()
    it = Tripled(iter(base))
    assert list(it) == [3 * x for x in range(12)]
    stats = it.stats()
    assert stats["elements_out"] == 12 and stats["records_read"] == 12
    assert "Tripled" in stats["stage_seconds"] and "Doubled" not in stats["stage_seconds"]


def test_every_dataset_iterator_takes_part_in_stats_and_other_iterators_do_not():
    loader_it = iter(dl.DataLoader(dl.RangeDataSource(4), dl.SequentialSampler(4)))
    users = Doubled(iter(dl.MapDataset.range(3).to_iter_dataset()))
    assert isinstance(loader_it, StatsParticipant) and isinstance(users, StatsParticipant)

    class TotalsOnly:
        def stats_totals(self):
            return {}

    # Half the hooks is not the protocol: every member is needed to add up.
    assert not isinstance(iter([1, 2]), StatsParticipant)
    assert not isinstance(TotalsOnly(), StatsParticipant)


def test_a_parent_that_does_not_take_part_is_read_as_a_source():
    it = Doubled(iter([1, 2, 3]))
    assert list(it) == [2, 4, 6]
    stats = it.stats()
    assert (stats["records_read"], stats["elements_out"], stats["batches_out"]) == (3, 3, 0)
    assert list(stats["stage_seconds"]) == ["Doubled"]


def test_the_window_is_the_last_seconds_and_never_exceeds_the_totals(monkeypatch):
    monkeypatch.setattr(stats_clock, "WINDOW_S", 0.2)
    monkeypatch.setattr(stats_clock, "SNAPSHOT_S", 0.05)
    it = iter(dl.DataLoader(dl.RangeDataSource(200), dl.SequentialSampler(200), [dl.MapTransform(slow), dl.Batch(2)]))
    for _ in range(100):
        next(it)
    stats = it.stats()
    window = stats["window"]
    # About WINDOW_S, unless a loaded machine left a gap between two next() calls with no
    # snapshot in it: then the window reaches back to the last one before the gap.
    assert 0 < window["seconds"] < stats["elapsed_s"]
    assert 0 < window["batches_out"] < stats["batches_out"] == 100
    assert 0 < window["records_read"] < stats["records_read"]
    for name, secs in window["stage_seconds"].items():
        assert secs <= stats["stage_seconds"][name] + 1e-9
    assert window["records_per_s"] == pytest.approx(window["records_read"] / window["seconds"])


def test_a_hook_receives_the_stats_every_so_often_from_next(monkeypatch):
    monkeypatch.setattr(stats_clock, "SNAPSHOT_S", 0.01)
    seen = []
    it = iter(dl.DataLoader(dl.RangeDataSource(60), dl.SequentialSampler(60), [dl.MapTransform(slow), dl.Batch(1)]))
    it.add_stats_hook(lambda stats: seen.append(stats["batches_out"]), every_s=0.03)
    started = time.monotonic()
    list(it)  # 60 batches of at least 2 ms: 120 ms, more on a loaded machine
    took = time.monotonic() - started
    # How many calls depends on how long the run took; that they come every_s apart
    # (not at every next()) and keep coming does not.
    assert 2 <= len(seen) <= took / 0.03 + 1, (seen, took)
    assert seen == sorted(seen) and seen[-1] <= 60


def test_a_hook_must_be_callable_and_its_period_positive():
    it = iter(dl.DataLoader(dl.RangeDataSource(4), dl.SequentialSampler(4)))
    with pytest.raises(TypeError, match="a stats hook must be callable with the stats dict, got 3"):
        it.add_stats_hook(3)
    with pytest.raises(ValueError, match="every_s must be a positive number of seconds, got 0"):
        it.add_stats_hook(print, every_s=0)


def test_log_stats_writes_one_absl_line(caplog):
    it = iter(dl.DataLoader(dl.RangeDataSource(64), dl.SequentialSampler(64), [dl.Batch(8)]))
    list(it)
    with caplog.at_level(logging.INFO, logger="absl"):
        dl.log_stats(it.stats())
    lines = [r.getMessage() for r in caplog.records if r.name == "absl"]
    assert len(lines) == 1
    assert lines[0].startswith("granary: ") and "records/s" in lines[0] and "batches/s" in lines[0]


def test_flatten_gives_metric_names_for_tensorboard_or_prometheus():
    it = iter(dl.DataLoader(dl.RangeDataSource(16), dl.SequentialSampler(16), [dl.Batch(4)]))
    list(it)
    flat = dl.flatten_stats(it.stats())
    assert flat["records_read"] == 16 and flat["batches_out"] == 4
    assert flat["window/batches_out"] == it.stats()["window"]["batches_out"]
    assert "stage_seconds/read" in flat and "workers/main/busy_share" in flat
    assert all(isinstance(v, (int, float)) for v in flat.values())
    assert flatten({"pipeline": {"source": "x"}}) == {}


def test_the_unit_log_is_bounded_and_read_from_any_point():
    it = iter(dl.DataLoader(dl.RangeDataSource(LOG_UNITS + 100), dl.SequentialSampler(LOG_UNITS + 100), [dl.Batch(1)]))
    list(it)
    stats: Stats = it.unit_stats
    assert len(stats.log) == LOG_UNITS
    tail = stats.log_since(LOG_UNITS + 90)
    assert [u.seq for u in tail] == list(range(LOG_UNITS + 90, LOG_UNITS + 100))
    assert stats.log_since(0)[0].seq == 100  # the oldest ones left the log
    assert stats.log_since(LOG_UNITS + 100) == []
    unit = tail[0]
    assert unit.worker == "main" and unit.records == 1 and unit.began <= unit.ended <= unit.got


def test_a_restore_keeps_counting():
    loader = dl.DataLoader(dl.RangeDataSource(20), dl.SequentialSampler(20), [dl.Batch(5)])
    it = iter(loader)
    next(it)
    state = it.get_state()
    next(it)
    it.set_state(state)
    list(it)
    stats = it.stats()
    assert stats["batches_out"] == 5 and stats["records_read"] == 25  # one batch read twice


def test_a_fast_stream_is_timed_one_call_in_sixteen_and_counted_exactly(monkeypatch):
    # What counts as fast is set high: on a loaded machine even range()'s calls can
    # average more than CHEAP_S, and this test is about what the clock does then.
    monkeypatch.setattr(stats_clock, "CHEAP_S", 1.0)
    engine = iter(dl.MapDataset.range(5000).to_iter_dataset())
    it = Doubled(Doubled(engine))
    assert sum(1 for _ in it) == 5000
    for clock in (it.stats_clock, it._parent.stats_clock, engine.stats_clock):
        assert clock.period == stats_clock.SAMPLE_EVERY
        assert clock.timed_calls < clock.calls / 8
    stats = it.stats()
    assert (stats["records_read"], stats["elements_out"]) == (5000, 5000)
    assert 0 < stats["stage_seconds"]["Doubled"] < stats["first_next_s"] + stats["wait_s"]


def test_slow_calls_are_all_timed():
    it = iter(dl.DataLoader(dl.RangeDataSource(80), dl.SequentialSampler(80), [dl.MapTransform(slow), dl.Batch(1)]))
    list(it)
    clock = it.stats_clock
    assert clock.period == 1 and clock.timed_calls == clock.calls == 80  # the end (StopIteration) too


def unit(worker, began, ended, records=8):
    from dataloader.engine.compute import UnitResult

    return UnitResult(0, records, [None], timings={"read": ended - began}, elements=records, worker=worker,
                      began=began, ended=ended, cpu_s=(ended - began) / 2)


def test_workers_that_appear_or_retire_keep_shares_of_their_own_time():
    """worker_count="auto" adds and retires workers mid-stream: shares are per worker
    index, over each worker's own time, and the window leaves out workers gone quiet."""
    from dataloader.engine.stats.shape import publish

    stats = Stats()
    for t in range(10):  # worker 0 busy half of each second from t=0 to 10
        stats.add(unit(0, t, t + 0.5), t + 0.5, t + 0.5, 0.0)
    for t in range(8, 10):  # worker 1 appears at t=8, busy all the time
        stats.add(unit(1, t, t + 1.0), t + 1, t + 1, 0.0)
    then = stats.totals(10.0)
    for t in range(10, 14):  # worker 0 retired at t=10; worker 1 goes on
        stats.add(unit(1, t, t + 1.0), t + 1, t + 1, 0.0)
    totals = stats.totals(14.0)
    out = publish(totals, elapsed_s=14, active_s=14, first_next_s=0, window=(then, 4.0), pipeline={})
    assert out["workers"]["0"]["busy_share"] == pytest.approx(5 / 14)  # 5 s busy since its first unit
    assert out["workers"]["1"]["busy_share"] == pytest.approx(1.0)  # busy every second since t=8
    assert set(out["window"]["workers"]) == {"1"}  # worker 0 did nothing in the last 4 s
    assert out["window"]["workers"]["1"]["busy_share"] == pytest.approx(1.0)
    assert out["units"] == 16 and out["window"]["units"] == 4


def test_a_stage_defining_a_stats_member_by_its_old_private_name_is_refused_when_made():
    # It would drop out of stats() silently: the collector reads stats_totals() now.
    with pytest.raises(TypeError, match=r"_stats_totals.*stats_totals"):
        class Old(dl.DatasetIterator):  # refused when made: its other methods do not matter
            def _stats_totals(self):
                return {}
