"""Elastic restore for every pipeline: across host changes, every record once.

Hosts are simulated in one process (one loader per ``ShardOptions(h, H)``); each phase
takes some steps on every host, saves every state, and the next phase restores them on
another host count with :func:`dataloader.iterator.elastic_iterator`; the last phase
runs to the end of the (one-epoch) stream. The record ids used over the whole run must
be those of one uninterrupted run, each exactly once.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import dataloader as dl
from dataloader.engine.restore.layout import Layout, next_layout
from dataloader.engine.restore.protocol import takes_every_host
from dataloader.engine.restore.samplers import ElasticSampler
from dataloader.errors import StateMismatchError
from dataloader.iterator import elastic_iterator
from tests.dataloader.engine.elastic_cases import (
    CHANGES,
    DATASETS,
    ISSUE_CHANGES,
    PIPELINES,
    as_x,
    make_loader,
    record_ids,
    reference,
    run,
)


@pytest.mark.parametrize("change", list(CHANGES))
@pytest.mark.parametrize("name", list(PIPELINES))
def test_every_record_is_used_exactly_once_across_host_changes(name, change):
    assert run(name, CHANGES[change]) == reference(name)


CUT_CHANGES = {  # more saves for elements cut across rows and rounds
    "1->2": [(1, 3), (2, None)],
    "2->3": [(2, 3), (3, None)],
    "3->1": [(3, 3), (1, None)],
    "1->2->3->1": [(1, 3), (2, 3), (3, 1), (1, None)],
    "1->3->2->1": [(1, 1), (3, 3), (2, 5), (1, None)],
    "2->3->1 at once": [(2, 0), (3, 1), (1, None)],
}


@pytest.mark.parametrize("change", list(CUT_CHANGES))
@pytest.mark.parametrize("name", ["first-fit, cut", "best-fit, cut"])
def test_elements_cut_across_packing_rounds_are_used_exactly_once(name, change):
    """Sequences up to 30 tokens into rows of 12: an element's pieces fall in several
    rows and rounds; a state names the used part as a count of tokens. Ids are counted
    per token, so a piece lost or repeated shows."""
    assert run(name, CUT_CHANGES[change]) == reference(name)


def test_a_round_that_starts_inside_a_cut_element_names_its_used_tokens():
    its = [iter(make_loader("first-fit, cut", h, 2)) for h in range(2)]
    for it in its:
        for _ in range(3):
            next(it)
    node = its[0].get_state()["stages"]
    assert node["piece"] == 1 and node["next_row"] == 0
    assert node["used"] == [[1, 0, {"tokens": 12}]]  # its first piece: 12 tokens


def test_a_cut_elements_unused_pieces_are_named_as_token_ranges():
    """Pieces 0..2 of a 3-piece element (rows of 12 tokens): the unused ones must be one
    run, named by where its tokens start (to the end) or [start, stop]; otherwise the
    state names nothing and an elastic restore from it is refused."""
    stage = make_loader("first-fit, cut", 0, 1).iterator()._parent  # the packer stage
    assert stage._used_pieces({(4, 0): ({0, 1, 2}, 3)}) == [[4, 0, None]]
    assert stage._used_pieces({(4, 0): ({0}, 3)}) == [[4, 0, {"tokens": 12}]]
    assert stage._used_pieces({(4, 0): ({0, 2}, 3)}) == [[4, 0, {"tokens": [12, 24]}]]
    assert stage._used_pieces({(4, 0): ({2}, 3)}) == [[4, 0, {"tokens": [0, 24]}]]
    assert stage._used_pieces({(4, 0): ({1}, 3)}) is None  # pieces 0 and 2 left: two runs


def test_a_state_that_cannot_name_a_cut_elements_rest_is_refused():
    its = [iter(make_loader("first-fit, cut", 0, 1))]
    next(its[0])
    state = json.loads(json.dumps(its[0].get_state()))
    state["stages"].pop("used")  # as a round with a middle piece handed out first leaves it
    with pytest.raises(StateMismatchError, match="middle piece"):
        elastic_iterator(make_loader("first-fit, cut", 0, 2), [state])


def test_rest_of_an_element_between_two_used_pieces_and_a_chain_of_them():
    from dataloader.engine.restore.layout import _merge
    from dataloader.engine.restore.relayout import _rest

    element = {"tokens": np.arange(30)}
    assert _rest(element, {"tokens": [12, 24]})["tokens"].tolist() == list(range(12, 24))
    assert _merge({"tokens": [12, 24]}, {"tokens": 5}) == {"tokens": [17, 24]}
    assert _merge({"tokens": 12}, {"tokens": [0, 6]}) == {"tokens": [12, 18]}
    assert _merge({"tokens": [12, 24]}, None) is None


@pytest.mark.parametrize("steps", [1, 2, 4, 5, 7])
@pytest.mark.parametrize("name", ["filter", "flat map, unbatched", "first-fit", "concat-then-split"])
def test_exactly_once_whatever_step_the_hosts_save_at(name, steps):
    assert run(name, [(2, steps), (3, steps), (1, None)]) == reference(name)


@pytest.mark.parametrize("name", ["filter", "first-fit", "flat map"])  # flat map: dropped outputs in workers
def test_exactly_once_with_worker_processes(name):
    assert run(name, [(2, 3), (3, 2), (1, None)], workers=2) == reference(name)


@pytest.mark.parametrize("change", ISSUE_CHANGES)
def test_end_pad_with_worker_processes_uses_every_record_once_at_every_host_change(change):
    """end="pad" through every change issue 33 names (3->1 and 1->2->3->1 end on one
    host, whose sampler shards nothing), the engine on 2 worker processes."""
    assert run("end pad", CHANGES[change], workers=2) == reference("end pad")


@pytest.mark.parametrize("workers", [0, 2])
def test_end_pad_restores_elastically_onto_one_host(workers):
    """The README's ``end="pad"`` example (9 records, 2 hosts, batches of 4) restored on
    one host, whose sampler shards nothing (``NoSharding``): every record once, and the
    step count computed again for the one host."""

    def host(index, count):
        shard = dl.ShardOptions(index, count) if count > 1 else dl.NoSharding()
        return dl.DataLoader(dl.RangeDataSource(9), dl.IndexSampler(9, shard, num_epochs=1),
                             [dl.MapTransform(as_x), dl.Batch(4)], end="pad", worker_count=workers)

    old = [iter(host(h, 2)) for h in range(2)]
    used = [x for it in old for x in record_ids("end pad", next(it))]
    states = [json.loads(json.dumps(it.get_state())) for it in old]
    for it in old:
        it.close()
    rest = list(host(0, 1).iterator(states))
    used += [x for batch in rest for x in record_ids("end pad", batch)]
    assert sorted(used) == list(range(9))
    assert len(rest) == 1 and rest[0]["mask"].tolist() == [True] * 1 + [False] * 3


def test_hosts_that_ran_unevenly_are_restored_too():
    """One host far ahead of the others (a real run's hosts save at the same step, but
    their positions differ after a filter; here they differ by whole batches)."""
    loaders = [make_loader("filter", h, 2) for h in range(2)]
    its = [iter(loader) for loader in loaders]
    used = []
    for h, steps in enumerate([1, 6]):
        for _ in range(steps):
            used += record_ids("filter", next(its[h]))
    states = [it.get_state() for it in its]
    for h in range(3):
        used += [i for out in elastic_iterator(make_loader("filter", h, 3), states) for i in record_ids("filter", out)]
    assert sorted(used) == reference("filter")


def test_a_restored_state_goes_on_on_the_same_host_count():
    states = None
    its = [iter(make_loader("flat map", h, 2)) for h in range(2)]
    for it in its:
        next(it)
    states = [it.get_state() for it in its]
    its = [elastic_iterator(make_loader("flat map", h, 3), states) for h in range(3)]
    for it in its:
        next(it)
    saved = [json.loads(json.dumps(it.get_state())) for it in its]
    assert all("elastic" in s for s in saved)
    rest = [record_ids("flat map", out) for out in its[1]]
    again = elastic_iterator(make_loader("flat map", 1, 3), saved[1])
    assert [record_ids("flat map", out) for out in again] == rest


def test_a_plain_loaders_iterator_takes_every_hosts_states_and_elastic_states():
    its = [iter(make_loader("filter", h, 2)) for h in range(2)]
    for it in its:
        next(it)
    states = [i.get_state() for i in its]
    via_function = elastic_iterator(make_loader("filter", 0, 3), states)
    plain = make_loader("filter", 0, 3).iterator(states)
    next(via_function), next(plain)
    state = plain.get_state()
    assert state == via_function.get_state() and "elastic" in state
    rest = [record_ids("filter", b) for b in plain]
    again = iter(make_loader("filter", 0, 3))
    again.set_state(state)
    assert [record_ids("filter", b) for b in again] == rest


def test_every_hosts_states_at_one_batch_boundary_restore_the_same_global_batches():
    """A plain batch, global batch 12 on 2 and on 3 hosts: the new hosts' step k is the
    old run's global batch k (as sets), as with the single-state restore."""
    def loader(h, count):
        return dl.DataLoader(dl.RangeDataSource(60), dl.IndexSampler(60, shuffle=True, seed=2, num_epochs=1),
                             [dl.Batch(12 // count)], shard_options=dl.ShardOptions(h, count))

    old = [iter(loader(h, 2)) for h in range(2)]
    for it in old:
        next(it)
    new = [loader(h, 3).iterator([it.get_state() for it in old]) for h in range(3)]
    steps = [sorted(x for it in new for x in next(it).tolist()) for _ in range(2)]
    assert steps == [sorted(x for it in old for x in next(it).tolist()) for _ in range(2)]


def test_elastic_restore_needs_every_old_hosts_state():
    its = [iter(make_loader("filter", h, 3)) for h in range(3)]
    states = [it.get_state() for it in its]
    with pytest.raises(StateMismatchError, match=r"one state from each of the old hosts, got shards \[0, 2\]"):
        elastic_iterator(make_loader("filter", 0, 2), [states[0], states[2]])


def test_elastic_restore_refuses_another_pipeline():
    states = [iter(make_loader("filter", h, 2)).get_state() for h in range(2)]
    with pytest.raises(StateMismatchError, match="operations="):
        elastic_iterator(make_loader("plain", 0, 3), states)


def test_the_layout_after_a_filter_is_a_few_progressions():
    """Two hosts that stopped at local positions 5 and 8: host 0's positions 5 to 8
    (global 10, 12, 14, 16) are unread, and everything from global 17 on: the
    leftovers are 10, 12, 14, and the frontier is 16 (16 and 17 and on, no gap)."""
    layout = next_layout(Layout(), 2, [(5, []), (8, [])], None)
    assert layout.describe() == {"frontier": 16, "extra": [[10, 2, 3]], "partial": []}
    sampler = ElasticSampler(dl.IndexSampler(40, num_epochs=1), layout, dl.ShardOptions(1, 3))
    # U = 10, 12, 14, 16, 17, 18, ...: host 1 of 3 reads U[1], U[4], U[7], ...
    assert sampler.global_positions(np.arange(4)).tolist() == [12, 17, 20, 23]
    assert sampler.num_positions == 9  # U has 3 + (40 - 16) = 27 positions: 1, 4, ..., 25


def test_layouts_stay_small_along_a_chain_of_restores():
    layout = Layout()
    count = 1
    for new_count in [2, 3, 1, 2, 3, 1, 3]:
        read = [(10 + 3 * h, []) for h in range(count)]
        layout = next_layout(layout, count, read, None)
        assert len(layout.extra) <= count
        count = new_count


def test_hosts_at_the_same_position_leave_no_leftovers():
    """A plain batch: every host used its first 5 positions, so the unread part is
    everything from global position 15 on, and the new hosts read the same global
    batches as the loader's single-state restore (position p*H/H')."""
    layout = next_layout(Layout(), 3, [(5, []), (5, []), (5, [])], None)
    assert layout.describe() == {"frontier": 15, "extra": [], "partial": []}
    sampler = ElasticSampler(dl.IndexSampler(60, num_epochs=1), layout, dl.ShardOptions(1, 2))
    assert sampler.global_positions(np.arange(3)).tolist() == [16, 18, 20]


def test_a_begun_flat_map_position_hands_out_only_its_unused_outputs():
    layout = next_layout(Layout(), 1, [(4, [(4, 0, None), (4, 1, None)])], None)
    assert layout.describe() == {"frontier": 4, "extra": [], "partial": [[4, 0, None], [4, 1, None]]}


def _state_with_dropped_outputs():
    """A new host's state whose last step (a batch after a flat map) spans a position
    whose first outputs were used before the change: its fingerprint names them."""
    name = "flat map"
    for k in range(1, 8):
        old = [iter(make_loader(name, h, 2)) for h in range(2)]
        for it in old:
            for _ in range(k):
                next(it)
        states = [it.get_state() for it in old]
        for j in range(3):
            it = elastic_iterator(make_loader(name, j, 3), states)
            next(it)
            state = it.get_state()
            p0, s0, p1, s1 = state["fingerprint"]["select"]
            if any((p0, s0) < (q, sub) < (p1, s1) for q, sub in state["fingerprint"].get("dropped", ())):
                return j, state, [record_ids(name, b) for b in it]
    raise AssertionError("no save dropped outputs inside a step")


def test_the_fingerprint_check_runs_after_an_elastic_restore_with_partly_used_outputs():
    j, state, rest = _state_with_dropped_outputs()
    it = make_loader("flat map", j, 3).iterator(state)  # checked: the dropped outputs are left out
    assert [record_ids("flat map", b) for b in it] == rest
    forged = json.loads(json.dumps(state))
    del forged["fingerprint"]["dropped"]  # the check must leave them out to match
    with pytest.raises(StateMismatchError, match="output differs"):
        make_loader("flat map", j, 3).iterator(forged)


def test_the_fingerprint_check_of_old_states_with_dropped_outputs_passes_on_a_new_count():
    """Old states from a restored layout (their steps dropped used outputs) checked by the
    hosts of the next change: the check is on and the records are each used once."""
    assert make_loader("flat map", 0, 1)._engine.verify_on_restore
    assert run("flat map", [(2, 1), (3, 1), (1, None)]) == reference("flat map")
    assert run("flat map", [(2, 2), (3, 1), (2, None)]) == reference("flat map")


def test_a_window_shuffle_iterator_over_a_loader_takes_every_old_hosts_states():
    """WindowShuffleIterDataset's iterator over a stream on the engine, restored with
    set_state(list of every old host's states): the window's elements not yet handed out
    are read again on the new hosts, each record once."""
    from dataloader.dataset.transformations.window_shuffle import WindowShuffleDatasetIterator

    name = "flat map, unbatched"
    old = [WindowShuffleDatasetIterator(make_loader(name, h, 2).iterator(), 5, 3) for h in range(2)]
    used = [i for it in old for _ in range(3) for i in record_ids(name, next(it))]
    states = [json.loads(json.dumps(it.get_state())) for it in old]
    assert all(s["pos_in_window"] == 3 and len(s["used"]) == 3 for s in states)
    for j in range(3):
        it = WindowShuffleDatasetIterator(make_loader(name, j, 3).iterator(), 5, 3)
        assert takes_every_host(it)
        it.set_state(states)
        used += [i for out in it for i in record_ids(name, out)]
    assert sorted(used) == reference(name)


def test_a_window_shuffle_over_an_iterator_of_one_state_refuses_every_hosts_states():
    from dataloader.dataset.transformations.window_shuffle import WindowShuffleDatasetIterator

    class Counting:  # an iterator that restores from its own state only
        n = 0

        def __iter__(self):
            return self

        def __next__(self):
            self.n += 1
            return self.n

        def get_state(self):
            return {"n": self.n}

        def set_state(self, state):
            self.n = state["n"]

    it = WindowShuffleDatasetIterator(Counting(), 3, 0)
    assert not takes_every_host(it)
    next(it)
    assert "used" not in it.get_state()  # its elements have no engine positions
    with pytest.raises(StateMismatchError, match="restores from one state only"):
        it.set_state([{}, {}])


def test_every_row_of_the_benchmark_table_is_a_pipeline_tested_here():
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[3] / "benchmarks" / "elastic_table.py"
    spec = importlib.util.spec_from_file_location("elastic_table", path)
    assert spec is not None and spec.loader is not None
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    assert set(table.ROWS) <= set(PIPELINES) | set(DATASETS)
    assert {"first-fit, cut", "best-fit, cut", "stream window shuffle", "stream window shuffle, first-fit"} <= set(table.ROWS)
