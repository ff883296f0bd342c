"""InterleaveOrder: the position arithmetic of an interleave, checked against the
interleave itself on every small case."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import dataloader as dl
from dataloader.dataset.streams.order import InterleaveOrder


def interleaved(counts: list[int], cycle_length: int) -> list[tuple[int, int]]:
    """What InterleaveIterDataset yields over files of ``counts`` rows: (file, row)."""
    files = [dl.MapDataset.source([(f, r) for r in range(n)]).to_iter_dataset() for f, n in enumerate(counts)]
    return list(dl.experimental.InterleaveIterDataset(files, cycle_length=cycle_length))


CASES = [
    *[(list(c), k) for c in itertools.product([0, 1, 2, 5], repeat=3) for k in (1, 2, 3)],
    ([3, 1, 2], 2),
    ([7, 3, 12, 1, 1, 9, 0, 4], 3),
    ([4] * 20, 16),  # more files than slots, all alike
    (list(np.random.default_rng(0).integers(0, 9, size=40)), 16),
]


@pytest.mark.parametrize(("counts", "cycle"), CASES)
def test_positions_are_where_the_interleave_puts_each_row(counts, cycle):
    expected = interleaved(counts, cycle)
    order = InterleaveOrder(counts, cycle)
    assert len(order) == len(expected)
    files, rows = order.locate(np.arange(len(order)))
    assert list(zip(files.tolist(), rows.tolist())) == expected


@pytest.mark.parametrize(("counts", "cycle"), CASES[-4:])
def test_any_positions_in_any_order_locate_alike(counts, cycle):
    order = InterleaveOrder(counts, cycle)
    everything = list(zip(*(a.tolist() for a in order.locate(np.arange(len(order))))))
    picks = np.random.default_rng(1).integers(0, len(order), size=50)
    files, rows = order.locate(picks)
    assert list(zip(files.tolist(), rows.tolist())) == [everything[p] for p in picks.tolist()]


@pytest.mark.parametrize(("counts", "cycle"), CASES[-4:])
def test_the_interleaves_state_at_each_step_is_that_steps_position(counts, cycle):
    files = [dl.MapDataset.source([(f, r) for r in range(n)]).to_iter_dataset() for f, n in enumerate(counts)]
    it = iter(dl.experimental.InterleaveIterDataset(files, cycle_length=cycle))
    order = InterleaveOrder(counts, cycle)
    for step in range(len(order) + 1):
        state = it.get_state()
        consumed = {
            int(i): s["position"]
            for i, s, ended in zip(state["iterators_in_use_indices"], state["iterators_in_use_states"],
                                   state["exhausted"])
            if s is not None and not ended
        }
        assert order.position(consumed, state["next_index_in_datasets"]) == step
        next(it, None)


def test_a_position_outside_the_stream_is_named():
    order = InterleaveOrder([2, 3], 16)
    with pytest.raises(IndexError, match="position 5 is out of range for a stream of 5 rows"):
        order.locate([0, 5])
    with pytest.raises(ValueError, match="file 1 at row 4 is not a point"):
        order.position({1: 4}, 2)


def test_no_files_is_an_empty_stream():
    order = InterleaveOrder([], 16)
    assert len(order) == 0
    with pytest.raises(IndexError):
        order.locate([0])
