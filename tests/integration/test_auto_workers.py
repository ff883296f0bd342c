"""worker_count="auto": workers added and retired mid-epoch, and not one batch changes."""

from __future__ import annotations

import time

import pytest

import dataloader as dl
from tests.helpers import take
from tests.integration import workers_pipelines as wp
from tests.integration.conftest import child_pids, wait_until

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(180)]


def make(n, worker_count, slow=True, num_epochs=1):
    # 2 ms of waiting per record (no CPU): 4 ms a batch for one worker whatever the load.
    slowly = [dl.MapTransform(wp.slow_identity)] if slow else []
    return dl.DataLoader(
        dl.RangeDataSource(n), dl.IndexSampler(n, shuffle=True, seed=1, num_epochs=num_epochs),
        [*slowly, dl.MapTransform(wp.to_array), dl.Batch(2)], worker_count=worker_count)


# The longest a phase may take to show its change. On an idle machine each takes about a
# second; beside other jobs far longer, so a phase runs until its change is seen, not for
# a fixed number of batches.
PHASE_S = 240


@pytest.mark.timeout(3 * PHASE_S)
def test_workers_come_and_go_with_the_consumers_demand_and_the_batches_stay_the_same():
    n = 1200
    auto = dl.AutoWorkers(max_workers=4, initial=1, interval_s=0.2)
    it = iter(make(n, auto, num_epochs=None))
    executor = it._executor
    got = []

    def counts():
        return [c for _, c in executor.worker_counts]

    def consume_until(changed, step_s=0.0):
        deadline = time.monotonic() + PHASE_S
        while not changed() and time.monotonic() < deadline:
            got.append(next(it)["id"].tolist())
            time.sleep(step_s)  # a training step: the workers idle meanwhile
        return changed()

    try:
        assert counts() == [1]
        # A starved consumer gets workers: one, then as many again (retiring needs a
        # few idle workers).
        assert consume_until(lambda: max(counts()) > 2), counts()
        assert consume_until(lambda: counts()[-1] < max(counts()), step_s=0.04), counts()  # slow steps give some back
        got += [b["id"].tolist() for b in take(it, 20)]
        assert wait_until(lambda: not executor._workers.retired or (executor._workers.reap_retired() or False))
    finally:
        it.close()
    reference = take(iter(make(n, 0, slow=False, num_epochs=None)), len(got))
    assert got == [b["id"].tolist() for b in reference]


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
    assert wait_until(lambda: not child_pids())
