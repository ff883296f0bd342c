"""Elastic restore through the pooled element-wise stage (``ShippedElementwiseIterator``).

Under ``mp_prefetch`` the ``map``/``filter`` calls after a packer or a window shuffle run
on the worker pool. A packer over such a stage names its rows' records through the
stage's ``last_tag()``, and such a stage over a packer passes every old host's states
down (``set_state(list)``), restarting empty as the element-by-element stage does. Hosts
are simulated in one process, as in ``test_elastic_restore``; every record once.
"""

from __future__ import annotations

import numpy as np
import pytest

import dataloader as dl
from dataloader.engine.stages.shipped import ShippedElementwiseIterator
from dataloader.errors import StateMismatchError
from tests.dataloader.engine.elastic_cases import (
    CHANGES,
    DATASETS,
    ISSUE_CHANGES,
    _first_fit,
    _shuffled,
    _stream,
    as_tokens,
    fan_out,
    keep,
    make_dataset_iterator,
    make_loader,
    reference,
    run,
)


def _stages(it):
    seen = []
    while it is not None:
        seen.append(it)
        parents = getattr(it, "_parents", ())
        it = parents[0] if len(parents) == 1 else None
    return seen


@pytest.mark.parametrize("name", list(DATASETS))
def test_the_datasets_hold_every_kept_record_and_pool_their_element_wise_calls(name):
    it = make_dataset_iterator(name, 0, 1)
    try:
        pooled = any(isinstance(s, ShippedElementwiseIterator) for s in _stages(it))
    finally:
        it.close()
    assert pooled == ("pooled" in name)
    kept = [x for x in range(103) if keep(x)]
    per_token = DATASETS[name][1] == "tokens"  # one id per token (1 + x % 7 of them)
    assert reference(name) == sorted(x for x in kept for _ in range(1 + x % 7 if per_token else 1))


@pytest.mark.parametrize("change", list(CHANGES))
@pytest.mark.parametrize("name", list(DATASETS))
def test_every_record_is_used_exactly_once_through_the_pooled_stage(name, change):
    assert run(name, CHANGES[change]) == reference(name)


@pytest.mark.parametrize("name", ["pooled map over first-fit", "first-fit over pooled map"])
def test_exactly_once_with_worker_processes(name):
    assert run(name, CHANGES["1->2->3->1"], workers=2) == reference(name)


@pytest.mark.parametrize("change", ISSUE_CHANGES)
@pytest.mark.parametrize("name", [name for name in DATASETS if name.startswith("batch over")])
def test_a_batch_over_a_window_shuffle_or_a_packer_takes_every_old_state_on_worker_processes(name, change):
    """The dataset API's .batch() after a window shuffle or a packer (with a .map()
    between or not) under mp_prefetch with 2 workers, restored from the list of every old
    host's states (issue 33 found it refused the list)."""
    assert run(name, CHANGES[change], workers=2) == reference(name)


@pytest.mark.parametrize("name", ["first-fit, map, filter", "stream window shuffle, map, first-fit"])
def test_a_loaders_pooled_stage_with_worker_processes_restores_exactly_once(name):
    it = make_loader(name, 0, 1, workers=2)
    stages = _stages(iter(it))
    assert any(isinstance(s, ShippedElementwiseIterator) for s in stages)
    stages[0].close()
    for change in ("2->3", "1->2->3->1"):
        assert run(name, CHANGES[change], workers=2) == reference(name)


def test_a_packer_over_the_pooled_stage_names_its_handed_rows_records():
    ds = _first_fit(_shuffled(_stream(0, 1).filter(keep)).map(as_tokens))
    it = iter(ds.mp_prefetch(dl.MultiprocessingOptions(num_workers=0)))
    row = next(it)
    state = it.get_state()
    it.close()
    packer = state
    while "packer" not in packer:
        packer = packer["parent"]
    segments = np.asarray(row["tokens_segment_ids"])
    ids = sorted(int(np.asarray(row["tokens"])[segments == s][0]) - 1 for s in np.unique(segments[segments > 0]))
    assert len(packer["used"]) == len(ids)  # one engine position per record in the row
    assert all(sub == 0 and used is None for _, sub, used in packer["used"])


def test_the_pooled_stage_says_no_tag_after_a_flat_map():
    stage = _shuffled(_stream(0, 1)).flat_map(fan_out).mp_prefetch(dl.MultiprocessingOptions(num_workers=0))
    it = iter(stage)
    next(it)
    shipped = [s for s in _stages(it) if isinstance(s, ShippedElementwiseIterator)]
    assert shipped and shipped[0].last_tag() is None
    it.close()


def _mid_round_states(make, count=2, steps=1):
    states = []
    for h in range(count):
        it = iter(make(h, count))
        for _ in range(steps):
            next(it)
        states.append(it.get_state())
        it.close()
    return states


@pytest.mark.parametrize("make", [
    # A packer over an iterator-level flat map: its outputs have no engine positions.
    lambda h, c: _first_fit(_shuffled(_stream(h, c).filter(keep)).flat_map(fan_out).map(as_tokens)),
    # A packer cutting another packer's rows into pieces: a piece holds parts of records.
    lambda h, c: _first_fit(_first_fit(_stream(h, c).filter(keep).map(as_tokens)), 5),
], ids=["first-fit over a flat map stage", "first-fit cutting first-fit's rows"])
def test_a_packer_that_cannot_name_its_rows_records_is_refused_mid_round(make):
    states = _mid_round_states(make)
    it = iter(make(0, 3))
    with pytest.raises(StateMismatchError, match="does not name as positions"):
        it.set_state(states)
    it.close()


def test_a_packer_over_a_packer_names_the_records_of_the_inner_rows_it_handed_out():
    ds = _first_fit(_first_fit(_stream(0, 1).filter(keep).map(as_tokens)), 24)
    it = iter(ds)
    row = next(it)
    state = it.get_state()
    it.close()
    tokens = np.asarray(row["tokens"])
    ids = {int(t) - 1 for t in tokens[tokens > 0]}
    assert state["next_row"] == 1
    # Every record of the handed row is named (the engine's local positions of a
    # one-host shuffled stream are not the ids, so count them).
    assert len(state["used"]) == len(ids)
    assert all(used is None for _, _, used in state["used"])
