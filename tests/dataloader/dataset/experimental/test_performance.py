"""pick_performance_config: Grain's one-shot choice of workers and buffers, by element size."""

from __future__ import annotations

import math

import numpy as np
import pytest

import dataloader as dl
from dataloader.dataset.experimental.performance import (
    WORKER_BASE_MB,
    element_bytes,
    workers_within,
)
from tests.helpers import assert_streams_equal

MB = 2**20


def one_mb_batches(n: int = 40, batch: int = 4) -> dl.MapDataset:
    """Batches of ``batch`` rows of 2**17 float64: ``batch`` MiB a batch."""
    return dl.MapDataset.range(n).seed(3).shuffle().map(lambda i: np.full(2**17, float(i))).batch(batch)


def memory_of(cfg: dl.experimental.PerformanceConfig, unit_bytes: float) -> float:
    mp = cfg.multiprocessing_options
    per_worker = WORKER_BASE_MB * MB + (mp.per_worker_buffer_size + 1) * unit_bytes
    return mp.num_workers * per_worker + cfg.read_options.prefetch_buffer_size * unit_bytes


def test_element_bytes_counts_array_buffers_in_nested_elements():
    element = {"tokens": np.zeros((2, 8), np.int32), "extra": (np.zeros(3, np.float64), [np.zeros(5, np.int8)])}
    assert element_bytes(element) == 64 + 24 + 5


@pytest.mark.parametrize("budget_mb", [30, 64, 100, 1000])
def test_workers_and_buffers_stay_within_the_budget(budget_mb):
    ds = one_mb_batches()
    cfg = dl.pick_performance_config(ds, ram_budget_mb=budget_mb, max_workers=64, max_buffer_size=None)
    assert isinstance(cfg, dl.PerformanceConfig)
    assert isinstance(cfg.multiprocessing_options, dl.MultiprocessingOptions)
    assert isinstance(cfg.read_options, dl.ReadOptions)
    unit = 4 * MB
    assert memory_of(cfg, unit) <= budget_mb * MB
    per_worker = WORKER_BASE_MB * MB + 3 * unit
    assert cfg.multiprocessing_options.num_workers == min(64, math.floor(budget_mb * MB / per_worker))


def test_never_more_workers_than_max_workers():
    cfg = dl.experimental.pick_performance_config(
        one_mb_batches(), ram_budget_mb=10_000, max_workers=3, max_buffer_size=None)
    assert cfg.multiprocessing_options.num_workers == 3


def test_buffers_never_exceed_max_buffer_size():
    cfg = dl.pick_performance_config(one_mb_batches(), ram_budget_mb=10_000, max_workers=2, max_buffer_size=1)
    assert cfg.multiprocessing_options.per_worker_buffer_size == 1
    assert cfg.read_options.prefetch_buffer_size == 1


def test_a_budget_too_small_for_one_worker_computes_in_process(caplog):
    with caplog.at_level("WARNING"):
        cfg = dl.pick_performance_config(one_mb_batches(), ram_budget_mb=5, max_workers=8, max_buffer_size=None)
    assert cfg.multiprocessing_options.num_workers == 0
    assert cfg.read_options.prefetch_buffer_size == 1  # 5 MB left holds one 4 MB batch
    assert "does not hold one worker" in caplog.text


def test_a_small_budget_trades_buffer_for_a_worker():
    """17 MB: a worker with 2 buffered 4 MB batches and the one it computes (8 + 12 MB)
    does not fit; with 1 buffered (8 + 8 MB) it does."""
    cfg = dl.pick_performance_config(one_mb_batches(), ram_budget_mb=17, max_workers=8, max_buffer_size=None)
    assert (cfg.multiprocessing_options.num_workers, cfg.multiprocessing_options.per_worker_buffer_size) == (1, 1)


def test_an_unbatched_stream_prices_a_unit_of_many_elements():
    ds = dl.MapDataset.range(40).map(lambda i: np.zeros(2**14))  # 128 KiB an element, 16 MiB a unit
    cfg = dl.pick_performance_config(ds.to_iter_dataset(), ram_budget_mb=100, max_workers=8, max_buffer_size=None)
    assert cfg.multiprocessing_options.num_workers == workers_within(100 * MB, 128 * 2**17, 2, 8) == 1


def test_workers_within_counts_base_and_buffered_units():
    assert workers_within(100 * MB, 10 * MB, 2, cap=16) == 2  # 38 MB a worker
    assert workers_within(100 * MB, 0, 2, cap=5) == 5
    assert workers_within(1 * MB, 0, 2, cap=5) == 0


def test_max_workers_zero_gives_no_workers():
    cfg = dl.pick_performance_config(one_mb_batches(), ram_budget_mb=100, max_workers=0, max_buffer_size=None)
    assert cfg.multiprocessing_options.num_workers == 0


def test_without_a_budget_the_choice_is_bounded_by_max_workers():
    cfg = dl.pick_performance_config(one_mb_batches(), ram_budget_mb=None, max_workers=2, max_buffer_size=None)
    assert 0 <= cfg.multiprocessing_options.num_workers <= 2


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"ram_budget_mb": 0}, ValueError, r"ram_budget_mb must be None or a number of megabytes > 0, got 0"),
        ({"max_workers": -1}, ValueError, r"max_workers must be None or an integer >= 0, got -1"),
        ({"max_buffer_size": 0}, ValueError, r"max_buffer_size must be None or an integer >= 1, got 0"),
        ({"samples_to_check": True}, ValueError, r"samples_to_check must be None or an integer >= 1, got True"),
    ],
)
def test_bad_arguments_name_the_value(kwargs, error, message):
    with pytest.raises(error, match=message):
        dl.pick_performance_config(one_mb_batches(), **kwargs)


def test_a_non_dataset_is_refused():
    with pytest.raises(TypeError, match=r"needs a MapDataset or IterDataset, got list"):
        dl.pick_performance_config([1, 2, 3], ram_budget_mb=10, max_workers=1, max_buffer_size=1)


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["map", "iter"])
def test_the_chosen_options_run_and_give_the_same_elements(kind):
    ds = one_mb_batches(24, 2)
    stream = ds.to_iter_dataset() if kind == "iter" else ds
    cfg = dl.pick_performance_config(stream, ram_budget_mb=40, max_workers=2, max_buffer_size=None)
    assert cfg.multiprocessing_options.num_workers == 2
    expected = list(ds.to_iter_dataset())
    with iter(ds.to_iter_dataset(cfg.read_options).mp_prefetch(cfg.multiprocessing_options)) as it:
        assert_streams_equal(list(it), expected)


def test_a_budget_above_what_the_container_has_left_is_lowered_to_it(monkeypatch, caplog):
    from dataloader.engine.pool.autoscale import limits

    found = limits.Limits(host_total=64 << 30, host_available=60 << 30, memory_room=40 * MB,
                          memory=limits.Limit(100 * MB, "/sys/fs/cgroup/memory.max"), affinity=8)
    monkeypatch.setattr(limits, "read_limits", lambda: found)
    with caplog.at_level("WARNING"):
        cfg = dl.experimental.pick_performance_config(one_mb_batches(), ram_budget_mb=1000, max_workers=8)
    assert memory_of(cfg, 4 * MB) <= 40 * MB  # the 40 MiB left, not the 1000 MB asked
    assert cfg.multiprocessing_options.num_workers == 2
    assert "ram_budget_mb=1000 is more than this container has left (40 MiB, of 100 MiB (memory.max))" in caplog.text


def test_default_cpus_are_the_containers_quota(monkeypatch):
    from dataloader.engine.pool.autoscale import limits

    found = limits.Limits(affinity=16, cpu_quota=limits.Limit(250_000, "cpu.max"))  # 2.5 CPUs
    monkeypatch.setattr(limits, "read_limits", lambda: found)
    cfg = dl.experimental.pick_performance_config(one_mb_batches(), ram_budget_mb=10_000)
    assert cfg.multiprocessing_options.num_workers == 3
