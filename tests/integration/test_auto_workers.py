"""worker_count="auto": workers added and retired mid-epoch, and not one batch changes."""

from __future__ import annotations

import time

import pytest

import dataloader as dl
from tests.integration import workers_pipelines as wp
from tests.integration.conftest import child_pids, wait_until

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(180)]


def make(n, worker_count, slow=True):
    # 2 ms of waiting per record (no CPU): 4 ms a batch for one worker whatever the load.
    slowly = [dl.MapTransform(wp.slow_identity)] if slow else []
    return dl.DataLoader(
        dl.RangeDataSource(n), dl.IndexSampler(n, shuffle=True, seed=1, num_epochs=1),
        [*slowly, dl.MapTransform(wp.to_array), dl.Batch(2)], worker_count=worker_count)


def test_workers_come_and_go_with_the_consumers_demand_and_the_batches_stay_the_same():
    n = 1200
    reference = [b["id"].tolist() for b in make(n, 0, slow=False)]
    auto = dl.AutoWorkers(max_workers=4, initial=1, interval_s=0.2)
    it = iter(make(n, auto))
    executor = it._executor
    got = []
    for i, batch in enumerate(it):
        got.append(batch["id"].tolist())
        if 150 <= i < 200:
            time.sleep(0.04)  # a slow training step: the workers are idle most of the time
    assert got == reference
    counts = [c for _, c in executor.worker_counts]
    top = counts.index(max(counts))
    assert counts[0] == 1 and max(counts) > 1, counts  # a starved consumer got workers
    assert min(counts[top:]) < max(counts), counts  # and the slow steps gave some back
    assert wait_until(lambda: not executor._workers.retired or (executor._workers.reap_retired() or False), 5)


def test_auto_workers_restore_exactly():
    n = 240
    auto = dl.AutoWorkers(max_workers=3, initial=2, interval_s=0.1)
    loader = make(n, auto)
    it = iter(loader)
    head = [next(it)["id"].tolist() for _ in range(30)]
    state = it.get_state()
    rest = [b["id"].tolist() for b in it]
    again = iter(make(n, 0))
    again.set_state(state)
    assert [b["id"].tolist() for b in again] == rest
    assert head + rest == [b["id"].tolist() for b in make(n, 0, slow=False)]


def test_auto_mp_prefetch_matches_in_process():
    ds = dl.MapDataset.range(300).map(wp.to_array).to_iter_dataset().batch(10)
    reference = [b["id"].tolist() for b in ds]
    it = iter(ds.mp_prefetch(dl.MultiprocessingOptions(num_workers="auto")))
    assert [b["id"].tolist() for b in it] == reference
    it.close()
    assert wait_until(lambda: not child_pids(), 10)
