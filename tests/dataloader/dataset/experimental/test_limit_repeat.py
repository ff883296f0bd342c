"""LimitIterDataset and RepeatIterDataset: Grain's semantics, restores at every step, bad input."""

from __future__ import annotations

import json

import pytest

import dataloader as dl
from dataloader.experimental import CacheIterDataset, LimitIterDataset, RepeatIterDataset
from tests.dataloader.dataset.experimental.streams import Counted, engine_stream
from tests.helpers import assert_restores_everywhere, assert_streams_equal


def test_limit_keeps_the_first_count_elements_as_in_grain():
    assert list(LimitIterDataset(dl.MapDataset.range(5).to_iter_dataset(), 2)) == [0, 1]


def test_limit_past_the_end_is_the_whole_stream():
    assert list(LimitIterDataset(dl.MapDataset.range(3).to_iter_dataset(), 10)) == [0, 1, 2]


def test_limit_does_not_read_the_parent_past_the_limit():
    source = Counted(list(range(100)))
    assert list(LimitIterDataset(source, 4)) == [0, 1, 2, 3]
    assert source.reads[0] == 4


def test_limit_restores_at_every_step():
    ds = LimitIterDataset(engine_stream().batch(2), 7)
    outputs = assert_restores_everywhere(lambda: iter(ds), limit=10)
    assert len(outputs) == 7


@pytest.mark.parametrize("count", [0, -1, 2.5, True, "3"])
def test_limit_refuses_a_count_that_is_not_positive(count):
    with pytest.raises(ValueError, match=rf"LimitIterDataset count must be a positive integer, got {count!r}"):
        LimitIterDataset(dl.MapDataset.range(3).to_iter_dataset(), count)


def test_limit_refuses_what_is_not_a_dataset():
    with pytest.raises(TypeError, match=r"LimitIterDataset reads an IterDataset .* got \[1, 2\]"):
        LimitIterDataset([1, 2], 1)


def test_repeat_iterates_the_parent_num_epochs_times_identically():
    ds = dl.MapDataset.range(6).seed(2).shuffle().to_iter_dataset()
    once = list(ds)
    assert list(RepeatIterDataset(ds, num_epochs=3)) == once * 3
    assert sorted(once) == list(range(6))


def test_repeat_none_repeats_for_ever():
    it = iter(RepeatIterDataset(dl.MapDataset.range(3).to_iter_dataset()))
    assert [next(it) for _ in range(10)] == [0, 1, 2, 0, 1, 2, 0, 1, 2, 0]


def test_repeat_of_an_empty_epoch_ends_instead_of_spinning():
    empty = dl.MapDataset.range(5).to_iter_dataset().filter(lambda x: x > 10)
    assert list(RepeatIterDataset(empty)) == []


def test_repeat_restores_at_every_step_across_epoch_boundaries():
    ds = RepeatIterDataset(engine_stream(12), num_epochs=3)
    outputs = assert_restores_everywhere(lambda: iter(ds), limit=40)
    assert len(outputs) == 3 * len(list(engine_stream(12)))


def test_repeat_state_is_the_epoch_and_the_parents_state():
    it = iter(RepeatIterDataset(Counted([1, 2]), num_epochs=2))
    assert [next(it), next(it), next(it)] == [1, 2, 1]
    assert it.get_state() == {"parent": {"i": 1}, "epoch": 1}


@pytest.mark.parametrize("epochs", [0, -2, 1.0])
def test_repeat_refuses_num_epochs_that_is_not_positive(epochs):
    with pytest.raises(ValueError, match=rf"num_epochs must be a positive integer, got {epochs!r}"):
        RepeatIterDataset(dl.MapDataset.range(3).to_iter_dataset(), epochs)


def test_a_state_of_another_iterator_is_refused():
    it = iter(RepeatIterDataset(Counted([1, 2]), num_epochs=2))
    with pytest.raises(dl.StateMismatchError, match=r"expected a state of RepeatIterDataset .*'epoch'"):
        it.set_state({"parent": {"i": 0}})


def test_limit_cache_repeat_restores_as_in_grains_test():
    """Grain's test_checkpointing_in_memory_with_limit_and_repeat."""
    ds = RepeatIterDataset(CacheIterDataset(LimitIterDataset(dl.MapDataset.range(10).to_iter_dataset(), 5)), 2)
    it = iter(ds)
    for _ in range(7):
        next(it)
    state = json.loads(json.dumps(it.get_state()))
    remaining = list(it)
    it = iter(ds)
    it.set_state(state)
    assert list(it) == remaining == [2, 3, 4]
    assert_streams_equal(list(ds), [0, 1, 2, 3, 4] * 2)
