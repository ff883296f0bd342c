"""The pool's scheduling window, driven by hand: no processes are started."""

from __future__ import annotations

import pytest

from dataloader.engine.pool.window import Outcome, Window


def units(n: int, size: int = 10):
    return iter([(i * size, (i + 1) * size) for i in range(n)])


def make(n_units: int = 10, size: int = 4, per_worker: int = 2, workers=(1, 2)) -> Window:
    window = Window(size, per_worker)
    for w in workers:
        window.add_worker(w)
    window.reset(units(n_units))
    return window


def test_hands_out_units_in_order_up_to_the_window_size():
    window = make(size=4)
    assert [window.next_unit() for _ in range(5)] == [0, 1, 2, 3, None]
    assert window.range(2) == (20, 30)


def test_the_consumer_taking_the_head_makes_room_for_one_more_unit():
    window = make(size=2)
    a, b = window.next_unit(), window.next_unit()
    assert window.next_unit() is None
    window.finish(a, Outcome("a"))
    assert window.take_head() == Outcome("a")
    assert window.next_unit() == 2
    assert b == 1


def test_results_come_out_in_unit_order_whatever_order_they_finish_in():
    window = make(size=4)
    for _ in range(3):
        window.next_unit()
    window.finish(2, Outcome("c"))
    window.finish(1, Outcome("b"))
    assert window.take_head() is None  # unit 0 is not finished: nothing may overtake it
    window.finish(0, Outcome("a"))
    assert [window.take_head().value for _ in range(3)] == ["a", "b", "c"]
    assert window.take_head() is None


def test_picks_the_least_loaded_ready_worker_with_room():
    window = make(per_worker=2, workers=(1, 2, 3))
    window.sent(1, window.next_unit(), None)
    window.sent(1, window.next_unit(), None)
    window.sent(2, window.next_unit(), None)
    assert window.pick_worker([1, 2, 3]) == 3
    assert window.pick_worker([1, 2]) == 2
    assert window.pick_worker([1]) is None  # worker 1 holds per_worker units already


def test_answers_must_come_in_the_order_the_tasks_were_sent():
    window = make()
    window.sent(1, window.next_unit(), "block0")
    window.sent(1, window.next_unit(), "block1")
    with pytest.raises(AssertionError, match=r"answered unit 1 .* oldest task was unit 0"):
        window.answered(1, window.generation, 1)


def test_answers_about_a_stream_before_a_reset_are_recognised_as_stale():
    window = make()
    window.sent(1, window.next_unit(), "old-block")
    old = window.generation
    window.reset(units(5))
    entry = window.answered(1, old, 0)
    assert entry.token == "old-block" and entry.generation != window.generation
    assert window.next_unit() == 0  # the new stream starts from its own unit 0


def test_a_dead_workers_units_go_out_again_first_and_in_order():
    window = make(size=6)
    for unit in (window.next_unit(), window.next_unit(), window.next_unit()):
        window.sent(1, unit, f"block{unit}")
    window.sent(2, window.next_unit(), "block3")
    tokens, poisoned = window.worker_died(1, max_crashes=3)
    assert tokens == ["block0", "block1", "block2"] and poisoned == []
    assert [window.next_unit() for _ in range(4)] == [0, 1, 2, 4]
    assert window.held(2) == 1


def test_a_unit_that_kills_its_worker_max_crashes_times_is_poisoned():
    window = make(size=4, workers=())
    first, second = window.next_unit(), window.next_unit()
    for attempt in range(3):
        worker = 10 + attempt  # each attempt on a fresh worker holding both units
        window.add_worker(worker)
        window.sent(worker, first, None)
        window.sent(worker, second, None)
        _, poisoned = window.worker_died(worker, max_crashes=3)
        if attempt < 2:
            assert poisoned == []
            assert [window.next_unit(), window.next_unit()] == [first, second]
    assert poisoned == [first]
    # Only the first unit a dead worker held is to blame: the second goes out again.
    assert window.next_unit() == second


def test_stale_units_of_a_dead_worker_are_not_sent_again():
    window = make()
    window.sent(1, window.next_unit(), "old")
    window.reset(units(3))
    tokens, poisoned = window.worker_died(1, max_crashes=3)
    assert tokens == ["old"] and poisoned == []
    assert window.next_unit() == 0


def test_finished_once_every_unit_was_handed_to_the_consumer():
    window = make(n_units=2, size=4)
    assert not window.finished
    for _ in range(2):
        window.finish(window.next_unit(), Outcome(None))
    assert window.next_unit() is None and not window.finished
    window.take_head()
    window.take_head()
    assert window.finished


def test_a_unit_given_back_goes_out_before_new_ones():
    window = make()
    first = window.next_unit()
    window.give_back(first)
    assert window.next_unit() == first
    assert window.next_unit() == 1


def test_current_is_the_oldest_unit_a_worker_holds():
    window = make()
    assert window.current(1) is None
    window.sent(1, window.next_unit(), "block0")
    window.sent(1, window.next_unit(), "block1")
    assert window.current(1).unit == 0
    window.answered(1, window.generation, 0)
    assert window.current(1).unit == 1
    assert window.current(99) is None  # a worker the window does not know


def test_a_timed_out_worker_blames_its_current_unit_and_the_rest_go_out_again():
    window = make(size=6)
    for unit in (window.next_unit(), window.next_unit(), window.next_unit()):
        window.sent(1, unit, f"block{unit}")
    tokens, stuck = window.worker_timed_out(1)
    assert tokens == ["block0", "block1", "block2"]
    assert stuck == 0  # not sent again: the caller finishes it with the timeout error
    assert [window.next_unit() for _ in range(3)] == [1, 2, 3]


def test_a_timed_out_worker_on_a_stale_unit_blames_nothing():
    window = make()
    window.sent(1, window.next_unit(), "old")
    window.reset(units(3))
    window.sent(1, window.next_unit(), "new")
    tokens, stuck = window.worker_timed_out(1)
    assert tokens == ["old", "new"] and stuck is None
    assert window.next_unit() == 0  # the new stream's unit goes out again


def _finished(window: Window, unit: int, seconds_per_position: float = 1e-6) -> None:
    from types import SimpleNamespace

    start, stop = window.range(unit)
    result = SimpleNamespace(start=start, stop=stop, began=0.0, ended=seconds_per_position * (stop - start), outputs=[0])
    window.finish(unit, Outcome(result))


def test_finished_units_size_the_units_made_next():
    from dataloader.engine.sizing import Units, UnitSizer, sized_ranges

    sizer = UnitSizer(cap=1024)
    window = Window(2, 2)
    window.add_worker(1)
    window.reset(Units(sized_ranges(0, None, 128, sizer), sizer))
    lengths = []
    for _ in range(6):
        unit = window.next_unit()
        assert unit is not None
        lengths.append(window.range(unit)[1] - window.range(unit)[0])
        _finished(window, unit)
        window.take_head()
    assert lengths == [1, 2, 4, 8, 16, 32]


def test_a_unit_sent_again_covers_the_range_it_was_made_with_though_sizes_changed():
    from dataloader.engine.sizing import Units, UnitSizer, sized_ranges

    sizer = UnitSizer(cap=1024)
    window = Window(4, 4)
    window.add_worker(1)
    window.add_worker(2)
    window.reset(Units(sized_ranges(0, None, 128, sizer), sizer))
    a = window.next_unit()
    _finished(window, a)  # cheap: the units made from now on grow
    b = window.next_unit()
    assert b is not None
    window.sent(2, b, "block-b")
    lost = window.range(b)
    c = window.next_unit()
    assert c is not None
    _finished(window, c)
    tokens, poisoned = window.worker_died(2, max_crashes=3)
    assert tokens == ["block-b"] and poisoned == []
    assert window.next_unit() == b  # sent again first, over the same positions
    assert window.range(b) == lost
    d = window.next_unit()
    assert d is not None and window.range(d)[1] - window.range(d)[0] > lost[1] - lost[0]
