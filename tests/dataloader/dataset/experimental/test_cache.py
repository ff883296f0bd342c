"""CacheIterDataset: one computation of the stream, later passes from memory, small exact states."""

from __future__ import annotations

import json

import pytest

import dataloader as dl
from dataloader.experimental import (
    CacheIterDataset,
    LimitIterDataset,
    RepeatIterDataset,
    assert_equal_output_after_checkpoint,
)
from tests.dataloader.dataset.experimental.streams import Counted, engine_stream
from tests.helpers import assert_restores_everywhere, assert_streams_equal


def test_cache_hands_out_the_parents_elements():
    """Grain's test_in_memory_iter."""
    ds = CacheIterDataset(dl.MapDataset.range(5).to_iter_dataset().map(lambda x: x**2))
    assert list(ds) == [0, 1, 4, 9, 16]


def test_an_empty_stream_caches_as_empty():
    ds = CacheIterDataset(dl.MapDataset.range(5).to_iter_dataset().filter(lambda x: x > 9))
    assert list(ds) == [] and list(ds) == []


def test_later_passes_do_not_read_the_parent():
    """Grain's test_in_memory_with_limit_and_repeat: the parent is read once in all."""
    source = Counted(list(range(20)))
    ds = RepeatIterDataset(CacheIterDataset(LimitIterDataset(source, 10)), num_epochs=3)
    assert list(ds) == list(range(10)) * 3
    assert source.reads[0] == 10


def test_a_sliced_engine_stream_computes_each_element_once_under_cache_and_repeat():
    """Grain's limit + cache + repeat counts 10 map calls for 10 elements. An engine
    stream computes a unit ahead (docs: Differences from Grain), so a limit after it may
    run the map past its count; slicing the MapDataset first bounds the stream itself."""
    calls = []

    def counted(x):
        calls.append(x)
        return x

    ds = dl.MapDataset.range(20)[:10].to_iter_dataset().map(counted)
    assert list(RepeatIterDataset(CacheIterDataset(ds), num_epochs=2)) == list(range(10)) * 2
    assert sorted(calls) == list(range(10))
    calls.clear()
    limited = LimitIterDataset(dl.MapDataset.range(20).to_iter_dataset().map(counted), 10)
    assert list(RepeatIterDataset(CacheIterDataset(limited), num_epochs=2)) == list(range(10)) * 2
    assert set(range(10)) <= set(calls) and len(calls) == len(set(calls)) < 20  # once each, a unit ahead


def test_setting_an_earlier_state_serves_it_from_memory():
    source = Counted(list(range(6)))
    it = iter(CacheIterDataset(source))
    start = it.get_state()
    assert list(it) == list(range(6))
    it.set_state(start)
    assert list(it) == list(range(6))
    assert source.reads[0] == 6


def test_checkpointing_as_in_grain():
    assert_equal_output_after_checkpoint(CacheIterDataset(dl.MapDataset.range(5).to_iter_dataset()))


def test_cache_under_repeat_restores_at_every_step():
    ds = RepeatIterDataset(CacheIterDataset(engine_stream(15)), num_epochs=3)
    outputs = assert_restores_everywhere(lambda: iter(ds), limit=45, fresh_iterator_every=3)
    assert_streams_equal(outputs, list(engine_stream(15)) * 3)


def test_a_restore_in_a_later_pass_does_not_replay_the_stream():
    source = Counted(list(range(100)))
    ds = RepeatIterDataset(CacheIterDataset(source), num_epochs=2)
    it = iter(ds)
    for _ in range(190):
        next(it)
    state = json.loads(json.dumps(it.get_state()))
    source.reads[0] = 0
    restored = iter(ds)
    restored.set_state(state)
    assert list(restored) == list(range(90, 100))
    assert source.reads[0] == 10  # from the restored position on, nothing before it


def test_the_state_holds_positions_not_data():
    it = iter(CacheIterDataset(Counted([list(range(1000))] * 50)))
    sizes = []
    for _ in range(50):
        next(it)
        sizes.append(len(json.dumps(it.get_state())))
    assert max(sizes) < 60, sizes
    assert it.get_state() == {"parent": {"i": 50}, "position": 50}


def test_a_state_of_another_iterator_is_refused():
    it = iter(CacheIterDataset(Counted([1])))
    with pytest.raises(dl.StateMismatchError, match=r"expected a state of CacheIterDataset .*'position'"):
        it.set_state({"i": 0})
