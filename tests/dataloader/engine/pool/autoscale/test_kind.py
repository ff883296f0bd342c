"""worker_kind="auto": the decision from the trial's numbers, fed by hand (no thread, no
clock), among them the schedstat figures of real runs on a loaded machine."""

from __future__ import annotations

import pytest

from dataloader.engine.pool.autoscale import kind as kind_module
from dataloader.engine.pool.autoscale.kind import (
    GIL_LIMIT,
    PAIR_UNITS_PER_THREAD,
    SOLO_UNITS,
    KindTrial,
    choose_at_start,
)


def alone(trial: KindTrial, solo: float, waited: float = 0.0) -> float:
    """Thread 0's units alone at a CPU share of ``solo`` (of wall time), ``waited`` of
    their wall time waiting for a CPU; returns the time after them."""
    t = 0.0
    for _ in range(SOLO_UNITS):
        trial.add(0, t, t + 0.01, 0.01 * solo, waited=0.01 * waited)
        t += 0.01
    assert trial.solo_done and trial.verdict is None
    return t


def run_trial(threads: int, solo: float, beside: float, waited: tuple[float, float] = (0.0, 0.0)) -> KindTrial:
    """Thread 0 computes its first units alone at a CPU share of ``solo`` (CPU seconds
    per wall second), then every thread computes units at ``beside`` until the trial
    decides; ``waited``: the shares of wall time spent waiting for a CPU, alone and
    beside. Units take 10 ms of wall time."""
    trial = KindTrial(threads)
    t = alone(trial, solo, waited[0])
    for _ in range(20):
        for index in range(threads):
            trial.add(index, t, t + 0.01, 0.01 * beside, waited=0.01 * waited[1])
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


def test_a_machine_too_busy_to_measure_measures_again_then_takes_processes():
    trial = KindTrial(2)
    t = alone(trial, 1.0)
    rounds = 0
    while trial.verdict is None and rounds < 100:
        for index in range(2):  # 70% of each unit spent waiting for a CPU
            trial.add(index, t, t + 0.01, 0.003, waited=0.007)
        t += 0.01
        rounds += 1
    assert trial.verdict == "processes" and trial.gil_share is None
    assert trial.why.startswith("the machine was too busy to measure (the threads waited for a CPU 70% of the time, 3 rounds)")
    assert rounds > 3 * PAIR_UNITS_PER_THREAD  # three rounds were measured, not one


def test_a_busy_round_is_measured_again_and_a_quiet_one_decides():
    trial = KindTrial(2)
    t = alone(trial, 1.0)
    for _ in range(20):
        for index in range(2):
            trial.add(index, t, t + 0.01, 0.003, waited=0.007)
        t += 0.01
        if trial.rounds:  # the first busy round was thrown away
            break
    while trial.verdict is None:
        for index in range(2):
            trial.add(index, t, t + 0.01, 0.01)  # quiet, and the GIL released: threads
        t += 0.01
    assert trial.verdict == "threads" and trial.why == "measured on the first units"


# A pure-Python map (benchmarks/threads.py's) in the loader with 2 threads, on the 2-core
# VM at load 5 to 8: (wall, CPU, waiting for a CPU) in ms per unit, from the trial's
# clocks. Its first thread alone, then both threads.
LOADED_ALONE = [(60.2, 13.9, 46.3), (21.6, 12.7, 8.6), (29.0, 13.2, 15.2)]
LOADED_BESIDE = [
    (21.1, 13.1, 15.8), (21.3, 12.5, 29.9), (55.2, 13.0, 37.2), (89.3, 12.6, 90.3),
    (38.5, 13.2, 44.1), (39.0, 13.0, 35.7), (49.3, 13.7, 44.6), (52.4, 13.2, 41.2),
]


def replay_loaded_pure_python() -> KindTrial:
    trial = KindTrial(2)
    t = 0.0
    for wall, cpu, waited in [LOADED_ALONE[0], *LOADED_ALONE]:  # the first warms up
        trial.add(0, t, t + wall / 1e3, cpu / 1e3, waited / 1e3)
        t += wall / 1e3
    units = 0
    while trial.verdict is None and units < 200:
        wall, cpu, waited = LOADED_BESIDE[units % len(LOADED_BESIDE)]
        trial.add(units % 2, t, t + wall / 1e3, cpu / 1e3, waited / 1e3)
        t += wall / 1e3
        units += 1
    return trial


def test_pure_python_on_a_loaded_machine_gets_processes():
    trial = replay_loaded_pure_python()
    assert trial.verdict == "processes"
    assert trial.why.startswith("the machine was too busy to measure")


def test_on_a_loaded_machine_the_gil_waits_hide_in_the_wait_for_a_cpu(monkeypatch):
    """Why a busy round is not read: the same figures, read, make pure Python look free."""
    monkeypatch.setattr(kind_module, "BUSY_LIMIT", 2.0)
    trial = replay_loaded_pure_python()
    assert trial.verdict == "threads"
    assert trial.gil_share is not None and trial.gil_share < GIL_LIMIT


# The same map at a load of 4 (the threads waited for a CPU 43% of the time, a round that
# counts): with the waits taken out the share reads 0; as they are, it reads the GIL.
LIGHT_ALONE = [(33.1, 14.3, 18.8), (17.5, 12.9, 4.7), (12.7, 12.5, 0.0), (12.8, 12.7, 0.0)]
LIGHT_WARM = [(23.4, 12.8, 11.3), (27.5, 12.8, 20.1)]  # each thread's first unit beside
LIGHT_BESIDE = [
    (20.9, 12.8, 7.1), (16.2, 12.3, 10.4), (21.0, 12.9, 7.0), (18.4, 12.9, 7.4),
    (16.4, 12.5, 3.7), (20.9, 12.8, 14.2), (21.0, 13.0, 7.7), (18.3, 12.3, 7.7),
]


def test_a_gil_wait_that_became_a_wait_for_a_cpu_is_still_read():
    """At a load of 4 the pure-Python units' GIL waits were runnable time: with the waits
    for a CPU taken out the share reads 0; as they are, it reads about a third, and the
    larger reading is the one kept (here just under the limit: one run, at the edge)."""
    trial = KindTrial(2)
    t = 0.0
    for wall, cpu, waited in LIGHT_ALONE:
        trial.add(0, t, t + wall / 1e3, cpu / 1e3, waited / 1e3)
        t += wall / 1e3
    for units, (wall, cpu, waited) in enumerate(LIGHT_WARM + LIGHT_BESIDE):
        trial.add(units % 2, t, t + wall / 1e3, cpu / 1e3, waited / 1e3)
        t += wall / 1e3
    assert trial.why == "measured on the first units"
    assert trial.gil_share == pytest.approx(0.336, abs=0.01)
