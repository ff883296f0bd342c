"""The ``executor`` entry of ``stats()["pipeline"]`` and the advice it changes: with Ray
actors computing the units, the advice names ``RayExecutor(num_workers=...)``, not
``worker_count``, and this container's CPUs do not cap it (a real Ray loader's stats are
checked in tests/integration/test_ray_executor.py)."""

from __future__ import annotations

import dataloader as dl
from dataloader.engine.in_process import InProcessExecutor
from dataloader.engine.stats.pipeline import describe_pipeline

RAY = {"kind": "ray", "actors": 3, "remote_actors": 2, "local_actors": 1, "units_per_worker": 2,
       "num_cpus_per_worker": 1.0, "resources": {}}
QUOTA = {"cpus": 2, "cpu_quota": 1.5, "cpu_limit": "cpu.max", "memory_mb": None, "memory_limit": None}


class Elsewhere:
    """An executor of the user's own (computes in this process, as a stand-in)."""

    def __init__(self, description=None):
        if description is not None:
            self.describe = lambda: description

    def make_executor(self, plan, plan_bytes, position, init_fn=None):
        return InProcessExecutor(plan, position, read_options=dl.ReadOptions())


def loader(**kw):
    return dl.DataLoader(dl.RangeDataSource(16), dl.SequentialSampler(16), [dl.Batch(8)], **kw)


def run(loader_):
    it = iter(loader_)
    out = [b.tolist() for b in it]
    stats = it.stats()
    it.close()
    return out, stats


def test_the_pipeline_section_says_what_computes_the_units():
    assert run(loader())[1]["pipeline"]["executor"] == {"kind": "in_process"}
    plan = loader()._engine.plan
    pool = describe_pipeline(plan, worker_count=2, worker_buffer_size=2, read_options=dl.ReadOptions())
    assert pool["executor"] == {"kind": "pool"}
    out, stats = run(loader(executor=Elsewhere(RAY)))
    assert out == [list(range(8)), list(range(8, 16))]
    assert stats["pipeline"]["executor"] == RAY
    assert stats["pipeline"]["worker_count"] == 0
    # an executor that does not describe itself is named by its class
    assert run(loader(executor=Elsewhere()))[1]["pipeline"]["executor"] == {"kind": "Elsewhere"}


def starved(executor, container=QUOTA):
    stats = run(loader())[1]
    stats["pipeline"].update(device_feed={"cpu_buffer_size": 2, "device_buffer_size": 3},
                             executor=executor, container=container)
    stats.update(wait_share=0.5, wait_s=3.0)
    return next(a for a in dl.advise(stats) if a.rule == "step_starved")


def test_a_starved_step_on_ray_actors_says_raise_num_workers_whatever_the_container():
    remedy = starved(RAY).remedy
    assert remedy.startswith(
        "raise RayExecutor num_workers (now 2 actors, 1 more on this node (local_workers)), "
        "with executor.scale(n) while it runs")
    assert "worker_count" not in remedy
    assert "cpu.max" not in remedy  # the actors' CPUs are the cluster's
    only_remote = starved({**RAY, "local_actors": 0}).remedy
    assert only_remote.startswith("raise RayExecutor num_workers (now 2 actors), with")
    # the same stats without the executor entry: the pool's advice
    assert starved({"kind": "in_process"}).remedy.startswith("raise worker_count (now 0) up to 2")


def test_actors_waiting_on_io_are_told_to_use_more_actors():
    stats = run(loader())[1]
    stats["pipeline"]["executor"] = RAY
    stats.update(units=20, stage_seconds={"read": 9.0, "batch": 1.0},
                 workers={"0": {"busy_s": 10.0, "cpu_s": 1.0, "units": 10},
                          "1": {"busy_s": 10.0, "cpu_s": 1.0, "units": 10}})
    advice = next(a for a in dl.advise(stats) if a.rule == "io_wait")
    assert advice.cause.startswith("the Ray actors spent 90% of their time reading")
    assert "use more workers than cores (a larger RayExecutor num_workers (now 2 actors, 1 more" in advice.remedy


def test_the_run_summary_and_report_name_the_ray_actors_not_zero_worker_processes():
    from dataloader.cli.report import _counts
    from dataloader.cli.run import summary
    from dataloader.engine.stats.text import computed_by

    stats = run(loader(executor=Elsewhere(RAY)))[1]
    assert computed_by(stats["pipeline"]) == ("Ray actors", "3", "1 on this node")
    assert computed_by({**stats["pipeline"], "executor": {**RAY, "local_actors": 0, "actors": 2}}) == (
        "Ray actors", "2", "")
    text = summary(stats, 0.1, 1.0, [])
    assert "\nworkers        3 Ray actors (1 on this node): " in text
    assert "<tr><th>Ray actors</th><td class=n>3</td><td>1 on this node</td></tr>" in _counts(stats, 0.1)
    assert "worker processes" not in _counts(stats, 0.1)
    # the pool and this process keep their count, and an undescribed executor is named
    assert computed_by(run(loader())[1]["pipeline"]) == ("worker processes", "0", "")
    assert "\nworkers        0: " in summary(run(loader())[1], 0.1, 1.0, [])
    assert computed_by(run(loader(executor=Elsewhere()))[1]["pipeline"]) == ("executor Elsewhere", "?", "")
