"""stats() with worker processes: per-worker shares, transport, and the pool's advice."""

from __future__ import annotations

import time

import pytest

import dataloader as dl
from tests.dataloader.engine.test_stats import assert_shape
from tests.dataloader.pipelines import SlowStorage
from tests.helpers import wait_until
from tests.integration import workers_pipelines as wp

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]


def slow(x):
    time.sleep(0.003)
    return x


def burn(x):
    return sum(i * i for i in range(20_000)) + x


def consume(loader):
    it = iter(loader)
    out = list(it)
    stats = it.stats()
    it.close()
    return out, stats


def test_each_worker_has_its_busy_share_and_the_units_add_up():
    loader = dl.DataLoader(dl.RangeDataSource(160), dl.SequentialSampler(160),
                           [dl.MapTransform(slow), dl.Batch(4)], worker_count=2, warm_start=False)
    it = iter(loader)
    # Both workers ready before the first next(): on a loaded machine one may start so
    # late that the other has done every unit, which is not what this test is about.
    workers = it._executor._workers.workers
    assert wait_until(lambda: len(workers) == 2 and all(w.ready for w in workers))
    batches = list(it)
    stats = it.stats()
    it.close()
    assert_shape(stats)
    assert len(batches) == stats["batches_out"] == 40 and stats["records_read"] == 160
    workers = stats["workers"]
    assert {"0", "1"} <= set(workers) <= {"0", "1", "main"}
    assert sum(w["units"] for w in workers.values()) == stats["units"] == 40
    for key in ("0", "1"):
        assert workers[key]["units"] > 0 and 0.2 < workers[key]["busy_share"] <= 1.0
        assert workers[key]["busy_s"] >= 0.003 * 4 * workers[key]["units"]
        assert workers[key]["cpu_s"] < workers[key]["busy_s"]  # sleeping is not CPU
    assert stats["stage_seconds"]["transport"] > 0
    # Only the first window (2 workers x 2 units) was sent before a result sized the blocks.
    assert stats["pipe_units"] <= 4
    assert set(stats["window"]["workers"]) <= set(workers)


def test_dataset_iterators_over_workers_have_the_same_shape_and_worker_keys():
    # Without warm start (the default) every unit is computed by a worker: the keys are
    # worker indices only, never "main" (this process computed nothing).
    ds = (dl.MapDataset.range(120).map(slow).to_iter_dataset()
          .mp_prefetch(dl.MultiprocessingOptions(num_workers=2)).batch(6))
    it = iter(ds)
    assert len(list(it)) == 20
    stats = it.stats()
    it.close()
    assert_shape(stats)
    assert (stats["records_read"], stats["elements_out"], stats["batches_out"]) == (120, 120, 20)
    workers = stats["workers"]
    assert workers and set(workers) <= {"0", "1"}
    assert sum(w["units"] for w in workers.values()) == stats["units"] > 0


def test_results_through_pipes_are_counted_and_advised(monkeypatch):
    from dataloader.engine.pool import shm

    monkeypatch.setattr(shm, "block_room", lambda: 1000)
    loader = dl.DataLoader(dl.RangeDataSource(256), dl.SequentialSampler(256),
                           [dl.MapTransform(wp.to_array), dl.Batch(8)], worker_count=2,
                           warm_start=False)
    with pytest.warns(RuntimeWarning, match="results travel through pipes"):
        _, stats = consume(loader)
    # Every unit but those sent before the first result told the size (in blocks then):
    # at most the window, 2 workers x 2 units.
    assert 32 - 4 <= stats["pipe_units"] < 32
    assert stats["pipeline"]["shm_free_mb"] == pytest.approx(1000 / 2**20)
    advice = [a for a in dl.advise(stats) if a.rule == "shm_too_small"]
    assert len(advice) == 1
    assert "came through pipes instead of shared memory" in advice[0].cause
    assert "(0 MiB free)" in advice[0].cause and "more memory" in advice[0].remedy


def test_a_pool_bound_by_this_process_says_fewer_workers_or_bigger_units():
    # Units of one record: the workers compute each in microseconds, this process spends
    # far more handing them out and receiving them.
    loader = dl.DataLoader(dl.RangeDataSource(3000), dl.SequentialSampler(3000), [dl.Batch(1)], worker_count=2,
                           warm_start=False)
    _, stats = consume(loader)
    rules = [a.rule for a in dl.advise(stats)]
    assert "parent_bound" in rules
    text = str(next(a for a in dl.advise(stats) if a.rule == "parent_bound"))
    assert "this process, not the workers, sets the pace" in text
    assert "fewer workers" in text and "ReadOptions(unit_size=...)" in text


def test_workers_with_enough_to_do_are_not_parent_bound():
    loader = dl.DataLoader(dl.RangeDataSource(96), dl.SequentialSampler(96),
                           [dl.MapTransform(burn), dl.Batch(8)], worker_count=2)
    _, stats = consume(loader)
    assert "parent_bound" not in [a.rule for a in dl.advise(stats)]


def test_workers_waiting_on_io_say_read_threads_or_more_workers():
    loader = dl.DataLoader(SlowStorage(320, 0.005), dl.SequentialSampler(320), [dl.Batch(8)], worker_count=2,
                           warm_start=False)
    _, stats = consume(loader)
    advice = [a for a in dl.advise(stats) if a.rule == "io_wait"]
    assert len(advice) == 1
    assert advice[0].cause.startswith("the workers spent")
    assert "ReadOptions(num_threads=8" in advice[0].remedy and "worker_count=4" in advice[0].remedy
