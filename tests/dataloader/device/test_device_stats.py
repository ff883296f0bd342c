"""The device feed's stats(): the loader's numbers, the transfers, the step's waiting."""

from __future__ import annotations

import time

import numpy as np

import dataloader as dl
from tests.dataloader.engine.test_stats import assert_shape
from tests.helpers import wait_full


def row(i):
    return {"x": np.full(4, i, np.float32)}


def slow_row(i):
    time.sleep(0.004)
    return row(i)


def loader(fn, n=64):
    return dl.DataLoader(dl.RangeDataSource(n), dl.SequentialSampler(n), [dl.MapTransform(fn), dl.Batch(4)])


def test_device_iterator_stats_have_the_loaders_numbers_and_the_feeds():
    with dl.device_prefetch(loader(row), cpu_buffer_size=2, device_buffer_size=3) as it:
        batches = list(it)
        stats = it.stats()
    assert_shape(stats)
    assert (stats["records_read"], stats["elements_out"], stats["batches_out"]) == (64, 64, len(batches)) == (64, 64, 16)
    assert stats["stage_seconds"]["host_to_device"] > 0
    assert {"read", "MapTransform(row)", "batch"} <= set(stats["stage_seconds"])
    assert stats["queues"]["host_capacity"] == 2 and stats["queues"]["device_capacity"] == 3
    assert stats["pipeline"]["device_feed"] == {"cpu_buffer_size": 2, "device_buffer_size": 3}
    assert len(it.depth_samples) == 17  # one per next(), the end included


def test_the_feed_times_every_step_even_when_stats_were_asked_first():
    # Whichever use makes the clock (stats(), a hook, next()), the feed's is exact: the
    # step's waiting is measured on every call, never sampled as a fast stream's is.
    with dl.device_prefetch(loader(row, n=400)) as it:
        it.stats()  # makes the clock
        batches = sum(1 for _ in it)
    clock = it.stats_clock
    assert clock is not None and clock._exact
    assert batches == 100 and clock.timed_calls == clock.calls == batches  # all but the first, the end included


def test_the_steps_waiting_is_its_own_not_the_loaders():
    # A slow loader and a step that takes no time: the step waits nearly all the time.
    with dl.device_prefetch(loader(slow_row)) as it:
        list(it)
        starved = it.stats()
    # A fast loader and a slow step: the step hardly waits, although the loader's own
    # consumer (the feed's read thread) waits on the full queue. The step lasts until the
    # feed has filled both buffers again (while enough batches are left): a step measured
    # in the feed's progress, not in milliseconds that a busy machine stretches for the
    # feed's thread too.
    with dl.device_prefetch(loader(row, n=4 * 40)) as it:
        for k, _ in enumerate(it):
            if k < 30:
                wait_full(it)
        fed = it.stats()
    assert starved["wait_share"] > 0.7
    assert fed["wait_share"] < 0.3
    assert [a.rule for a in dl.advise(starved)] == ["step_starved"]
    assert "raise worker_count (now 0)" in str(dl.advise(starved)[0])
    assert "step_starved" not in [a.rule for a in dl.advise(fed)]


def test_a_plain_iterator_of_batches_still_has_stats_of_the_same_shape():
    batches = iter([{"x": np.zeros(2, np.float32)}] * 3)
    with dl.device_prefetch(batches) as it:
        assert len(list(it)) == 3
        stats = it.stats()
    assert_shape(stats)
    assert stats["batches_out"] == 3 and stats["records_read"] == 0


def test_a_hook_on_the_device_iterator_gets_its_stats():
    seen = []
    with dl.device_prefetch(loader(slow_row)) as it:
        it.add_stats_hook(seen.append, every_s=0.02)
        list(it)
    assert seen and all("host_to_device" in s["stage_seconds"] for s in seen)
