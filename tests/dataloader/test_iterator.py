"""The loader's iterator runs a frozen engine value, never the loader itself."""

from __future__ import annotations

import dataclasses
import gc
import weakref

import pytest

import dataloader as dl
from dataloader.engine.stats import FilterWatch
from dataloader.iterator import LoaderEngine


def small_loader(**kwargs):
    return dl.DataLoader(
        dl.RangeDataSource(12),
        dl.IndexSampler(12, shuffle=True, seed=3, num_epochs=1),
        [dl.MapTransform(lambda x: x * 10), dl.FilterTransform(lambda x: x % 3), dl.Batch(2)],
        **kwargs,
    )


def test_the_iterator_keeps_no_reference_to_its_loader():
    loader = small_loader()
    expected = [b.tolist() for b in small_loader()]
    it = iter(loader)
    gone = weakref.ref(loader)
    del loader
    gc.collect()
    assert gone() is None
    assert [b.tolist() for b in it] == expected


def test_the_engine_value_is_frozen_and_shared_by_the_loaders_iterators():
    loader = small_loader()
    assert isinstance(loader.engine, LoaderEngine)
    with pytest.raises(dataclasses.FrozenInstanceError):
        loader.engine.in_workers = True  # type: ignore[misc]
    first, second = iter(loader), iter(loader)
    assert first._engine is second._engine is loader.engine


def test_the_engine_says_where_units_run_and_describes_the_pipeline():
    in_process, pooled = small_loader(), small_loader(worker_count=2)
    assert (in_process.engine.in_workers, pooled.engine.in_workers) == (False, True)
    assert pooled.engine.pipeline["worker_count"] == 2
    assert small_loader(worker_count="auto").engine.pipeline["worker_count"] == "auto"
    it = iter(in_process)
    next(it)
    pipeline = it.stats()["pipeline"]
    assert pipeline["worker_count"] == 0 and pipeline["operations"] == in_process.operation_names


def test_each_restart_gets_a_fresh_filter_watch_and_none_without_thresholds():
    options = dl.DatasetOptions(filter_raise_threshold_ratio=0.9)
    engine = small_loader(options=options).engine
    first, second = engine.filter_watch(), engine.filter_watch()
    assert isinstance(first, FilterWatch) and first is not second
    off = dl.DatasetOptions(filter_warn_threshold_ratio=None, filter_raise_threshold_ratio=None)
    assert small_loader(options=off).engine.filter_watch() is None


def test_grains_signature_takes_the_loader_and_a_state():
    loader = small_loader()
    it = iter(loader)
    next(it)
    state = it.get_state()
    rest = [b.tolist() for b in it]
    resumed = dl.DataLoaderIterator(loader, state)
    assert [b.tolist() for b in resumed] == rest


def sequential_loader():
    return dl.DataLoader(dl.RangeDataSource(10), dl.IndexSampler(10, shuffle=False, num_epochs=1), [])


def test_a_grain_dataset_state_given_to_the_constructor_continues_as_set_state_does():
    expected = list(range(3, 10))
    assert list(sequential_loader().iterator({"next_index": 3})) == expected
    assert list(dl.DataLoaderIterator(sequential_loader(), {"next_index": 3})) == expected
    assert list(dl.DataLoaderIterator(sequential_loader().engine, '{"next_index": 3}')) == expected


def test_a_grain_state_the_constructor_cannot_continue_gets_set_states_message():
    loader = small_loader()
    with pytest.raises(dl.StateMismatchError) as by_set_state:
        iter(loader).set_state({"next_index": 3})
    with pytest.raises(dl.StateMismatchError) as by_constructor:
        loader.iterator({"next_index": 3})
    assert str(by_constructor.value) == str(by_set_state.value)
    assert "Grain's shuffle order" in str(by_constructor.value)
    assert "version None" not in str(by_constructor.value)


def test_something_that_is_not_a_loader_is_refused_naming_it():
    with pytest.raises(TypeError, match=r"needs a DataLoader \(or its \.engine\), got str: 'loader'"):
        dl.DataLoaderIterator("loader")
