"""What outer calls pass down: here, the default worker count of ``mp_prefetch()``."""

from __future__ import annotations

import dataloader as dl
from dataloader.dataset.context import default_worker_count
from dataloader.dataset.transformations.prefetch import MultiprocessPrefetchIterDataset
from dataloader.engine.pool.autoscale import limits


def test_mp_prefetch_without_options_starts_one_worker_per_cpu_the_container_allows(monkeypatch):
    # a 3.5-CPU quota on a 64-core host: 4 workers, not os.cpu_count()'s 64
    found = limits.Limits(affinity=64, cpu_quota=limits.Limit(350_000, "cpu.max"))
    monkeypatch.setattr(limits, "read_limits", lambda: found)
    assert default_worker_count() == 4
    ds = dl.MapDataset.range(8).to_iter_dataset()
    assert ds.mp_prefetch()._mp.num_workers == 4  # the engine-backed stream
    assert MultiprocessPrefetchIterDataset(ds).options.num_workers == 4  # any IterDataset


def test_without_a_quota_it_is_the_cpus_this_process_may_run_on(monkeypatch):
    monkeypatch.setattr(limits, "read_limits", lambda: limits.Limits(affinity=5))
    assert default_worker_count() == 5
