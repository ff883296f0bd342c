"""Thread workers: what threads change (and what they must not), under the one loop.

The batches and states equal to processes' and ``worker_count=0``'s are pinned by the
worker-count tests in ``test_workers.py``, which run for every ``worker_kind``; a stuck
unit on a thread, and a consumer pause, in ``test_stuck_workers.py`` beside processes.
"""

from __future__ import annotations

import json
import logging
import os
import threading

import pytest

import dataloader as dl
from dataloader.engine.pool.autoscale import kind as kind_module
from tests.dataloader.pipelines import make_loader
from tests.helpers import assert_streams_equal
from tests.integration import workers_pipelines as wp
from tests.integration.conftest import child_pids

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]


def make(op, n=40, batch=4, **kwargs):
    kwargs.setdefault("worker_count", 2)
    kwargs.setdefault("worker_kind", "threads")
    ops = [dl.MapTransform(op)] + ([dl.Batch(batch)] if batch else [])
    return dl.DataLoader(dl.RangeDataSource(n), dl.SequentialSampler(n), ops, **kwargs)


def test_an_unknown_worker_kind_is_refused_at_construction_naming_the_three(monkeypatch):
    expected = r'worker_kind.* must be "processes", "threads" or "auto", got \'fibers\''
    with pytest.raises(ValueError, match=expected):
        make(wp.slow_identity, worker_kind="fibers")
    with pytest.raises(ValueError, match=expected):
        dl.MultiprocessingOptions(num_workers=2, worker_kind="fibers")
    monkeypatch.setenv("GRANARY_WORKER_KIND", "fibers")
    with pytest.raises(ValueError, match=r"worker_kind \(from GRANARY_WORKER_KIND\) must be"):
        make(wp.slow_identity, worker_kind=None)


def resident_now() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def test_threads_start_no_process_and_stats_name_the_kind_and_each_threads_cpu():
    before = child_pids()
    it = iter(make(wp.slow_identity))
    got = [b.tolist() for b in it]
    assert child_pids() <= before  # no worker process (nor fork server) was started for it
    stats = it.stats()
    it.close()
    assert got == [list(range(i, i + 4)) for i in range(0, 40, 4)]
    described = stats["pipeline"]["workers"]
    assert {k: described[k] for k in ("worker_kind", "why", "threads")} == {
        "worker_kind": "threads", "why": "asked for", "threads": 2,
    }
    # The process's memory, once: the threads share it (and the training loop has it too).
    assert described["process_rss_mb"] * 2**20 == pytest.approx(resident_now(), rel=0.5)
    workers = stats["workers"]
    assert set(workers) <= {"0", "1"} and sum(w["units"] for w in workers.values()) == 10
    assert all(w["cpu_s"] > 0 and w["busy_s"] >= w["cpu_s"] * 0.5 for w in workers.values())


def test_the_environment_variable_chooses_threads_for_unchanged_code(monkeypatch):
    monkeypatch.setenv("GRANARY_WORKER_KIND", "threads")
    loader = make_loader("everything", n=30, epochs=1, worker_count=2)
    assert loader.worker_kind == "threads"
    it = iter(loader)
    got = list(it)
    assert it.stats()["pipeline"]["workers"]["worker_kind"] == "threads"
    it.close()
    assert_streams_equal(got, list(make_loader("everything", n=30, epochs=1)))


def test_results_are_handed_over_as_the_objects_made_not_copies():
    it = iter(make(wp.the_shared_object, n=6, batch=0))
    got = list(it)
    it.close()
    assert len(got) == 6 and all(x is wp.SHARED for x in got)


def test_an_operation_that_cannot_be_pickled_runs_on_threads():
    lock = threading.Lock()  # a lock does not pickle: processes refuse the pipeline

    def locked(x):
        with lock:
            return x + 1

    with pytest.raises(TypeError, match="cannot be sent to worker processes"):
        make(locked, worker_kind="processes")
    assert [b.tolist() for b in make(locked, n=8)] == [[1, 2, 3, 4], [5, 6, 7, 8]]
    auto = make(locked, n=8, worker_kind="auto")  # auto: threads, since processes cannot
    assert auto.worker_kind == "threads" and [b.tolist() for b in auto] == [[1, 2, 3, 4], [5, 6, 7, 8]]


def test_worker_init_fn_runs_once_in_each_thread(tmp_path):
    it = iter(make(wp.slow_identity, worker_count=3, worker_init_fn=wp.record_init(str(tmp_path))))
    assert len(list(it)) == 10
    it.close()
    assert sorted(os.listdir(tmp_path)) == [f"{i}-of-3-{os.getpid()}" for i in range(3)]


def test_a_raising_unit_arrives_at_its_record_as_the_exception_raised():
    it = iter(make(wp.raise_on_17))
    assert [next(it).tolist() for _ in range(4)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    with pytest.raises(dl.PipelineError, match=r"record 17") as info:
        next(it)
    it.close()
    assert info.value.record_index == 17
    assert isinstance(info.value.__cause__, ZeroDivisionError)  # the object itself, with its traceback
    assert info.value.__cause__.__traceback__ is not None


def test_auto_on_a_free_threaded_interpreter_chooses_threads_without_a_trial(monkeypatch):
    monkeypatch.setattr(kind_module, "gil_enabled", lambda: False)
    it = iter(make(wp.slow_identity, worker_kind="auto"))
    assert len(list(it)) == 10
    described = it.stats()["pipeline"]["workers"]
    assert (described["worker_kind"], described["why"]) == ("threads", "the interpreter runs without a GIL")
    it.close()


def test_auto_with_one_worker_chooses_processes():
    it = iter(make(wp.slow_identity, worker_kind="auto", worker_count=1))
    assert len(list(it)) == 10
    assert it.stats()["pipeline"]["workers"]["worker_kind"] == "processes"
    it.close()


def test_auto_hands_over_to_processes_when_the_trial_says_so_and_the_stream_is_unchanged(monkeypatch, caplog):
    """The hand-over itself, made certain: every measured share is past a limit of -1,
    and no round is too busy to count."""
    monkeypatch.setattr(kind_module, "GIL_LIMIT", -1.0)
    monkeypatch.setattr(kind_module, "BUSY_LIMIT", 2.0)
    reference = list(make_loader("everything", n=3000, epochs=1))
    # Small units, many of them: the trial ends long before the stream does.
    it = iter(make_loader("everything", n=3000, epochs=1, worker_count=2, worker_kind="auto",
                          read_options=dl.ReadOptions(unit_size=16)))
    with caplog.at_level(logging.INFO, logger="dataloader"):
        got = list(it)
    stats = it.stats()
    it.close()
    assert_streams_equal(got, reference)
    assert stats["pipeline"]["workers"]["worker_kind"] == "processes"
    assert stats["pipeline"]["workers"]["why"].startswith("measured on the first units")
    assert any("worker_kind auto" in r.getMessage() and r.getMessage().endswith("processes") for r in caplog.records)


def test_auto_on_a_machine_too_busy_to_measure_hands_over_to_processes_and_says_why(monkeypatch):
    """Made certain: every round is past a busy limit of -1."""
    monkeypatch.setattr(kind_module, "BUSY_LIMIT", -1.0)
    reference = list(make_loader("everything", n=3000, epochs=1))
    it = iter(make_loader("everything", n=3000, epochs=1, worker_count=2, worker_kind="auto",
                          read_options=dl.ReadOptions(unit_size=16)))
    got = list(it)
    described = it.stats()["pipeline"]["workers"]
    it.close()
    assert_streams_equal(got, reference)
    assert described["worker_kind"] == "processes"
    assert described["why"].startswith("the machine was too busy to measure")


def test_the_dataset_apis_mp_prefetch_takes_the_kind_and_gives_the_same_elements_and_states():
    def chained(kind):
        return (
            dl.MapDataset.source(dl.RangeDataSource(23)).seed(7).shuffle().repeat(3)
            .map(wp.to_array).to_iter_dataset().random_map(lambda e, rng: {**e, "n": rng.integers(9)})
            .batch(4).mp_prefetch(dl.MultiprocessingOptions(num_workers=2, worker_kind=kind))
        )

    runs = {}
    for kind in ("processes", "threads"):
        it = iter(chained(kind))
        runs[kind] = [(x, json.dumps(it.get_state())) for x in it]
        assert it.stats()["pipeline"]["workers"]["worker_kind"] == kind
        it.close()
    assert_streams_equal([x for x, _ in runs["threads"]], [x for x, _ in runs["processes"]])
    assert [s for _, s in runs["threads"]] == [s for _, s in runs["processes"]]
