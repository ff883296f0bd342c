"""worker_kind="auto": the decision from the trial's numbers, fed by hand (no thread, no clock)."""

from __future__ import annotations

import pytest

from dataloader.engine.pool.autoscale.kind import (
    GIL_LIMIT,
    PAIR_UNITS_PER_THREAD,
    SOLO_UNITS,
    KindTrial,
    choose_at_start,
)


def alone(trial: KindTrial, solo: float) -> float:
    """Thread 0's units alone at a CPU share of ``solo``; returns the time after them."""
    t = 0.0
    for _ in range(SOLO_UNITS):
        trial.record(0, t, t + 0.01, 0.01 * solo)
        t += 0.01
    assert trial.solo_done and trial.verdict is None
    return t


def run_trial(threads: int, solo: float, beside: float) -> KindTrial:
    """Thread 0 computes its first units alone at a CPU share of ``solo`` (CPU seconds
    per wall second), then every thread computes units at ``beside`` until the trial
    decides. Units take 10 ms of wall time."""
    trial = KindTrial(threads)
    t = alone(trial, solo)
    for _ in range(20):
        for index in range(threads):
            trial.record(index, t, t + 0.01, 0.01 * beside)
        t += 0.01
        if trial.verdict is not None:
            break
    return trial


def test_units_that_hold_the_gil_wait_beside_each_other_and_choose_processes():
    trial = run_trial(2, solo=1.0, beside=0.5)  # pure Python: each thread runs half the time
    assert trial.gil_share == pytest.approx(1.0)
    assert trial.verdict == "processes"


def test_units_that_release_the_gil_keep_their_cpu_share_and_choose_threads():
    trial = run_trial(2, solo=1.0, beside=0.95)
    assert trial.gil_share == pytest.approx(1 / 0.95 - 1)
    assert trial.verdict == "threads"


def test_the_share_is_per_other_thread():
    # With 4 threads a share h lowers the CPU share by 1 + 3h: 1 / 1.6 is h = 0.2.
    trial = run_trial(4, solo=1.0, beside=1 / 1.6)
    assert trial.gil_share == pytest.approx(0.2)
    assert trial.verdict == "threads"


def test_waiting_on_io_is_not_read_as_a_held_gil():
    # Units that wait on reads 70% of their time, alone or not.
    trial = run_trial(2, solo=0.3, beside=0.3)
    assert trial.gil_share == pytest.approx(0.0)
    assert trial.verdict == "threads"


def test_the_limit_sits_between_the_two():
    assert run_trial(2, 1.0, 1 / (1 + GIL_LIMIT + 0.05)).verdict == "processes"
    assert run_trial(2, 1.0, 1 / (1 + GIL_LIMIT - 0.05)).verdict == "threads"


def test_the_choice_before_any_unit():
    assert choose_at_start("threads", 4, gil=True)[0] == "threads"
    assert choose_at_start("processes", 4, gil=False)[0] == "processes"
    assert choose_at_start("auto", 4, gil=False) == ("threads", "the interpreter runs without a GIL")
    assert choose_at_start("auto", 1, gil=True)[0] == "processes"
    assert choose_at_start("auto", 2, gil=True)[0] is None  # measured


def test_a_machine_too_busy_to_measure_measures_again_then_keeps_the_threads():
    trial = KindTrial(2)
    t = alone(trial, 1.0)
    rounds = 0
    while trial.verdict is None and rounds < 100:
        for index in range(2):  # 70% of each unit spent waiting for a CPU
            trial.record(index, t, t + 0.01, 0.003, waited=0.007)
        t += 0.01
        rounds += 1
    assert trial.verdict == "threads" and trial.gil_share is None
    assert trial.why.startswith("the machine was too busy to measure (the threads waited for a CPU 70% of the time, 3 rounds)")
    assert rounds > 3 * PAIR_UNITS_PER_THREAD  # three rounds were measured, not one


def test_a_busy_round_is_measured_again_and_a_quiet_one_decides():
    trial = KindTrial(2)
    t = alone(trial, 1.0)
    for _ in range(20):
        for index in range(2):
            trial.record(index, t, t + 0.01, 0.003, waited=0.007)
        t += 0.01
        if trial.rounds:  # the first busy round was thrown away
            break
    while trial.verdict is None:
        for index in range(2):
            trial.record(index, t, t + 0.01, 0.005)  # quiet: half the time waiting for the GIL
        t += 0.01
    assert trial.verdict == "processes" and trial.why == "measured on the first units"
