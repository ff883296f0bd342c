"""worker_count="auto": the decisions, from made-up measurements (no processes)."""

from __future__ import annotations

import pytest

from dataloader.engine.pool import autoscale
from dataloader.engine.pool.autoscale import Scaler
from dataloader.engine.pool.autoscale.limits import Limit, Limits
from dataloader.options import AutoWorkers, check_worker_count, most_workers


def scaler(**kwargs) -> Scaler:
    options = AutoWorkers(**{"max_workers": 16, "initial": 4, "interval_s": 1.0, **kwargs})
    return Scaler(options, cpus=16, now=0.0)


def plenty() -> int:
    return 100


def test_a_consumer_that_waits_half_the_time_gets_twice_the_workers():
    s = scaler()
    s.waited(0.5)
    assert s.decide(0.9, live=4, starting=False, room=plenty) == 0  # the interval is not over
    assert s.decide(1.0, live=4, starting=False, room=plenty) == 4


def test_a_little_waiting_adds_one_worker_and_a_lot_at_most_doubles():
    s = scaler()
    s.waited(0.08)
    assert s.decide(1.0, live=4, starting=False, room=plenty) == 1
    s.waited(0.95)
    assert s.decide(2.0, live=4, starting=False, room=plenty) == 4


def test_adding_stops_at_max_workers_and_at_the_budget():
    s = scaler(max_workers=6)
    s.waited(0.9)
    assert s.decide(1.0, live=4, starting=False, room=plenty) == 2
    s.waited(0.9)
    assert s.decide(2.0, live=6, starting=False, room=plenty) == 0
    s.waited(0.9)
    assert s.decide(3.0, live=4, starting=False, room=lambda: 1) == 1
    s.waited(0.9)
    assert s.decide(4.0, live=4, starting=False, room=lambda: 0) == 0


def test_the_budget_is_asked_only_when_adding():
    def room():
        raise AssertionError("asked")

    s = scaler()
    assert s.decide(1.0, live=4, starting=False, room=room) == 0


def test_idle_workers_are_retired_after_two_calm_intervals_keeping_one_spare():
    s = scaler()
    for t in (1.0, 2.0):
        for _ in range(10):
            s.sample(idle_workers=3)
        expected = 0 if t == 1.0 else -2
        assert s.decide(t, live=8, starting=False, room=plenty) == expected


def test_one_idle_worker_is_the_spare_and_stays():
    s = scaler()
    for t in (1.0, 2.0, 3.0):
        s.sample(idle_workers=1)
        assert s.decide(t, live=8, starting=False, room=plenty) == 0


def test_retiring_stops_at_min_workers():
    s = scaler(min_workers=3, initial=4)
    for t in (1.0, 2.0):
        s.sample(idle_workers=4)
        change = s.decide(t, live=4, starting=False, room=plenty)
    assert change == -1


def test_waiting_between_calm_intervals_resets_the_count():
    s = scaler()
    s.sample(idle_workers=4)
    assert s.decide(1.0, live=8, starting=False, room=plenty) == 0
    s.sample(idle_workers=4)
    s.waited(0.03)  # between the thresholds: neither calm nor short
    assert s.decide(2.0, live=8, starting=False, room=plenty) == 0
    s.sample(idle_workers=4)
    assert s.decide(3.0, live=8, starting=False, room=plenty) == 0


def test_intervals_with_workers_starting_say_nothing():
    s = scaler()
    s.waited(0.9)
    assert s.decide(1.0, live=4, starting=True, room=plenty) == 0
    s.waited(0.1)  # measured after the restart at t=1
    assert s.decide(2.0, live=4, starting=False, room=plenty) == 1


def test_room_counts_memory_and_shm():
    gib = 2**30
    host = Limits(host_total=10 * gib, host_available=5 * gib)
    options = AutoWorkers(min_free_memory=0.2)  # keep 2 GiB: 3 GiB to spend
    assert autoscale.room(options, gib, 0, 0, None, host) == 3
    # blocks count against memory too, and against half the free /dev/shm
    assert autoscale.room(options, gib // 2, 2, gib // 4, None, host) == 3
    assert autoscale.room(options, gib // 2, 2, gib // 4, 2 * gib, host) == 2
    assert autoscale.room(options, gib, 0, 0, None, Limits(host_total=10 * gib, host_available=gib)) == 0


def test_room_is_what_the_container_allows_not_the_host():
    gib, mib = 2**30, 2**20
    # the 1.4 GiB container of issue 21 on a host with 20 GiB free: workers of 300 MiB
    container = Limits(host_total=32 * gib, host_available=20 * gib, memory_room=int(1.4 * gib) - 200 * mib,
                       memory=Limit(int(1.4 * gib), "/sys/fs/cgroup/memory.max"))
    options = AutoWorkers(min_free_memory=0.1)  # 10% of the container's 1.4 GiB stays free
    assert autoscale.room(options, 300 * mib, 0, 0, None, container) == 3
    assert autoscale.room(options, 300 * mib, 0, 0, None, Limits(host_total=32 * gib, host_available=20 * gib)) == 57
    # a pids limit: 4 tasks a worker, 16 kept for the trainer
    assert autoscale.room(options, 1, 0, 0, None, Limits(pids_room=40)) == 6
    assert autoscale.room(options, 1, 0, 0, None, Limits(pids_room=10)) == 0


def test_private_bytes_of_this_process_is_measured():
    import os

    assert autoscale.private_bytes(os.getpid()) > 1 << 20
    assert autoscale.private_bytes(2**22 + 12345) == 0  # no such process


def test_bounds_default_to_the_cpus():
    assert AutoWorkers().bounds(cpus=16) == (1, 16, 8)
    assert AutoWorkers().bounds(cpus=1) == (1, 1, 1)
    assert AutoWorkers(min_workers=2, initial=3, max_workers=4).bounds(cpus=64) == (2, 4, 3)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"min_workers": 0}, r"AutoWorkers.min_workers must be an integer >= 1, got 0"),
    ({"min_workers": 4, "max_workers": 2}, r"AutoWorkers.max_workers must be an integer >= 4, got 2"),
    ({"initial": 9, "max_workers": 8}, r"AutoWorkers.initial=9 is above max_workers=8"),
    ({"interval_s": 0}, r"AutoWorkers.interval_s must be a positive number of seconds"),
    ({"min_free_memory": 1.5}, r"AutoWorkers.min_free_memory must be a fraction in \[0, 1\), got 1.5"),
    ({"max_shm_share": "half"}, r"AutoWorkers.max_shm_share must be a fraction in \[0, 1\), got 'half'"),
])
def test_bad_auto_options_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AutoWorkers(**kwargs)


def test_worker_count_accepts_auto_and_names_anything_else():
    assert check_worker_count("worker_count", "auto") == AutoWorkers()
    assert check_worker_count("worker_count", 3) == 3
    with pytest.raises(ValueError, match=r'worker_count must be an integer >= 0 or "auto", got \'many\''):
        check_worker_count("worker_count", "many")
    with pytest.raises(ValueError, match=r'worker_count must be an integer >= 0 or "auto", got -1; .*grain_worker_count=-1.*pass worker_count="auto"'):
        check_worker_count("worker_count", -1)
    assert most_workers(AutoWorkers(max_workers=5)) == 5
    assert most_workers(2) == 2


def test_an_oom_kill_lowers_the_ceiling_below_the_count_it_happened_at(monkeypatch):
    from dataloader.engine.pool.autoscale import measure

    kills = [5]
    monkeypatch.setattr(measure, "oom_kills", lambda: (kills[0], "memory.events"))
    scaling = measure.Scaling(AutoWorkers(min_workers=2, max_workers=8, initial=4), buffer_size=2)
    assert not scaling._oom_killed()
    kills[0] = 6
    assert scaling._oom_killed() and not scaling._oom_killed()  # each rise is seen once
    assert scaling.back_off(live=6) == -1 and scaling.scaler.high == 5
    # the Scaler adds no worker above the new ceiling, however long the consumer waits
    scaling.scaler.waited(10.0)
    assert scaling.scaler.decide(100.0, live=5, starting=False, room=plenty) == 0
    assert scaling.back_off(live=2) == 0 and scaling.scaler.high == 2  # never below the floor


def test_a_worker_costs_the_most_any_ready_worker_holds_now_and_smaller_ones_will_grow():
    import os
    from types import SimpleNamespace

    from dataloader.engine.pool.autoscale.measure import worker_memory

    me = autoscale.private_bytes(os.getpid())
    grown = SimpleNamespace(pid=os.getpid(), ready=True)  # this process stands in for a grown worker
    starting = SimpleNamespace(pid=2**22 + 12345, ready=False)
    workers = SimpleNamespace(live=lambda: [starting, grown], worker_bytes=lambda: 1 << 20)
    cost, growth = worker_memory(workers)
    assert me > 1 << 20 and cost >= me * 0.9  # not the 1 MiB the first held at start
    assert growth == cost  # the starting worker will grow to it; the grown one will not
    assert worker_memory(SimpleNamespace(live=lambda: [starting], worker_bytes=lambda: 1 << 20)) == (1 << 20, 1 << 20)


def test_memory_the_running_workers_will_still_take_is_not_spent_twice():
    gib = 2**30
    host = Limits(host_total=10 * gib, host_available=5 * gib)
    assert autoscale.room(AutoWorkers(min_free_memory=0.0), gib, 0, 0, None, host) == 5
    assert autoscale.room(AutoWorkers(min_free_memory=0.0), gib, 0, 0, None, host, reserved=2 * gib) == 3
