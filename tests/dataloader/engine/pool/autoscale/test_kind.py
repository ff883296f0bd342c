"""worker_kind="auto": the decision from the trial's numbers, fed by hand (no thread, no clock)."""

from __future__ import annotations

import pytest

from dataloader.engine.pool.autoscale.kind import GIL_LIMIT, KindTrial, choose_at_start


def run_trial(threads: int, solo_s: float, beside_s: float, waited: float = 0.0) -> KindTrial:
    """Thread 0 computes two units alone (10 records each, ``solo_s`` per record), then
    every thread computes units of ``beside_s`` per record until the trial decides."""
    trial = KindTrial(threads)
    t = 0.0
    for _ in range(2):
        trial.record(0, t, t + 10 * solo_s + waited, waited, 10)
        t += 10 * solo_s + waited
    assert trial.solo_done and trial.verdict is None
    for _ in range(20):
        for index in range(threads):
            trial.record(index, t, t + 10 * beside_s + waited, waited, 10)
        t += 10 * beside_s + waited
        if trial.verdict is not None:
            break
    return trial


def test_units_that_hold_the_gil_stretch_beside_each_other_and_choose_processes():
    trial = run_trial(2, solo_s=0.001, beside_s=0.002)  # pure Python: twice as long beside another
    assert trial.gil_share == pytest.approx(1.0)
    assert trial.verdict == "processes"


def test_units_that_release_the_gil_keep_their_time_and_choose_threads():
    trial = run_trial(2, solo_s=0.001, beside_s=0.00105)
    assert trial.gil_share == pytest.approx(0.05)
    assert trial.verdict == "threads"


def test_the_share_is_per_other_thread():
    # With 4 threads a share h stretches a unit by 1 + 3h: 1.6x is h = 0.2.
    trial = run_trial(4, solo_s=0.001, beside_s=0.0016)
    assert trial.gil_share == pytest.approx(0.2)
    assert trial.verdict == "threads"


def test_time_spent_waiting_for_a_cpu_is_not_read_as_a_held_gil():
    # A busy machine: every unit waited 30 ms for a CPU, which the trial takes off.
    trial = run_trial(2, solo_s=0.001, beside_s=0.001, waited=0.03)
    assert trial.gil_share == pytest.approx(0.0)
    assert trial.verdict == "threads"


def test_the_limit_sits_between_the_two():
    assert run_trial(2, 0.001, 0.001 * (1 + GIL_LIMIT + 0.05)).verdict == "processes"
    assert run_trial(2, 0.001, 0.001 * (1 + GIL_LIMIT - 0.05)).verdict == "threads"


def test_the_choice_before_any_unit():
    assert choose_at_start("threads", 4, gil=True)[0] == "threads"
    assert choose_at_start("processes", 4, gil=False)[0] == "processes"
    assert choose_at_start("auto", 4, gil=False) == ("threads", "the interpreter runs without a GIL")
    assert choose_at_start("auto", 1, gil=True)[0] == "processes"
    assert choose_at_start("auto", 2, gil=True)[0] is None  # measured
