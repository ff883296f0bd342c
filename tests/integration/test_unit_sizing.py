"""Units sized by cost, with worker processes: every element and state is that of fixed
units, for 1 and 2 workers, after restores, and when a worker dies mid-stream.

Sizes are forced in this process, where the pool makes its units (workers only compute
the ranges they are sent), so no test depends on timing (see forced_sizes).
"""

from __future__ import annotations

from typing import Any

import pytest

import dataloader as dl
from tests.dataloader.engine.forced_sizes import MIXED, fixed, force_sizes, run
from tests.dataloader.pipelines import make_loader
from tests.helpers import assert_streams_equal
from tests.integration import workers_pipelines as wp

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("name", ["map", "filter", "flat_map", "everything"])
def test_workers_give_the_elements_and_states_of_fixed_units(name, workers, monkeypatch):
    kw = {"n": 150, "epochs": 2}
    want_out, want_states = run(fixed(name, **kw))
    force_sizes(monkeypatch, MIXED)
    got_out, got_states = run(make_loader(name, worker_count=workers, worker_buffer_size=2, **kw))
    assert_streams_equal(got_out, want_out)
    assert got_states == want_states


def test_restores_with_two_workers_continue_as_fixed_units_do(monkeypatch):
    kw = {"n": 150, "epochs": 2}
    want_out, want_states = run(fixed("everything", **kw))
    for k in (0, 1, len(want_out) // 3, len(want_out) - 1):
        force_sizes(monkeypatch, MIXED, seed=k)
        got_out, got_states = run(make_loader("everything", worker_count=2, **kw), want_states[k])
        assert_streams_equal(got_out, want_out[k:])
        assert got_states == want_states[k:], f"restored at step {k}"


def test_a_unit_lost_with_a_killed_worker_is_computed_again_identically(tmp_path, monkeypatch):
    def make(workers: int, unit_size: int | None) -> Any:
        return dl.DataLoader(
            dl.RangeDataSource(200), dl.SequentialSampler(200),
            [dl.MapTransform(wp.kill_once_marker(str(tmp_path / f"seen-{workers}"))),
             dl.FilterTransform(lambda x: x % 4 != 1)],
            worker_count=workers, warm_start=False, read_options=dl.ReadOptions(unit_size=unit_size),
        )

    (tmp_path / "seen-0").touch()  # the reference kills nothing
    want_out, want_states = run(make(0, 128))
    force_sizes(monkeypatch, MIXED)
    got_out, got_states = run(make(2, None))
    assert (tmp_path / "seen-2").exists()  # record 25 did kill a worker
    assert got_out == want_out
    assert got_states == want_states
