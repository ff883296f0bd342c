"""Iterators as Orbax v1 ``StatefulCheckpointable``s, as Grain 0.2.18's are."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from orbax.checkpoint import v1 as ocp

import dataloader as dl
from dataloader.checkpoint import state_filename

LENGTHS = np.random.default_rng(3).integers(1, 12, size=80)


def loader_iterator():
    sampler = dl.IndexSampler(60, shuffle=True, seed=1, num_epochs=2)
    return iter(dl.DataLoader(dl.RangeDataSource(60), sampler, [dl.Batch(4)]))


def packed_iterator():
    ds = dl.MapDataset.range(len(LENGTHS)).seed(5).shuffle().map(
        lambda i: {"tokens": np.arange(LENGTHS[i], dtype=np.int32) + 100 * int(i)})
    ds = dl.experimental.FirstFitPackIterDataset(
        ds.to_iter_dataset(), length_struct={"tokens": 16}, num_packing_bins=3, seed=2)
    return iter(ds)


def iterator_with_workers():
    ds = dl.MapDataset.range(40).seed(5).shuffle().map(lambda x: x * 3).to_iter_dataset().batch(4)
    return iter(ds.mp_prefetch(dl.MultiprocessingOptions(num_workers=2)))


ITERATORS = {
    "loader": loader_iterator,
    "packed": packed_iterator,
    "workers": pytest.param(iterator_with_workers, marks=pytest.mark.multiprocess),
    "device": lambda: dl.device_prefetch(loader_iterator(), cpu_buffer_size=2, device_buffer_size=2),
}


def as_lists(elements):
    return [json.dumps(np.asarray(e).tolist() if not isinstance(e, dict) else
                       {k: np.asarray(v).tolist() for k, v in e.items()}) for e in elements]


@pytest.mark.parametrize("make", list(ITERATORS.values()), ids=list(ITERATORS))
def test_save_and_load_checkpointables_continue_the_stream(tmp_path, make):
    with make() as whole:
        expected = as_lists(whole)
    assert len(expected) > 6
    it = make()
    saved_after = as_lists(next(it) for _ in range(4))
    ocp.save_checkpointables(tmp_path / "step", {"iter": it})
    next(it)  # the run goes on after the save; the checkpoint keeps element 4
    it.close()
    with make() as fresh:
        loaded = ocp.load_checkpointables(tmp_path / "step", {"iter": fresh})
        assert loaded["iter"] is fresh
        assert as_lists(fresh) == expected[4:]
    assert saved_after == expected[:4]


def test_each_process_writes_its_state_as_indented_json_with_grains_file_name(tmp_path):
    it = loader_iterator()
    next(it)
    state = it.get_state()
    ocp.save_checkpointables(tmp_path / "step", {"iter": it})
    files = sorted(p.name for p in (tmp_path / "step" / "iter").iterdir())
    assert files == [state_filename(0, 1)]
    text = (tmp_path / "step" / "iter" / files[0]).read_text()
    assert json.loads(text) == state
    assert text == json.dumps(state, indent=4)


class _Creating:
    """Orbax's PathAwaitingCreation, with the directory already made."""

    def __init__(self, path):
        self.path = path

    async def await_creation(self):
        return self.path


def test_a_failed_write_leaves_no_state_file_behind(tmp_path):
    it = loader_iterator()
    (tmp_path / state_filename(0, 1)).mkdir()  # the rename onto it fails
    (tmp_path / state_filename(0, 1) / "x").write_text("")

    async def save():
        await (await it.save(_Creating(tmp_path)))

    with pytest.raises(IsADirectoryError):
        asyncio.run(save())
    assert sorted(p.name for p in tmp_path.iterdir()) == [state_filename(0, 1)]


def test_save_refuses_a_state_that_is_not_json_before_writing(tmp_path):
    class Odd(dl.DatasetIterator):
        def __next__(self):
            return 0

        def get_state(self):
            return {"at": object()}

        def set_state(self, state):
            pass

    with pytest.raises(TypeError, match="not JSON-able"):
        asyncio.run(Odd().save(_Creating(tmp_path)))
    assert list(tmp_path.iterdir()) == []


def test_load_continues_a_state_grain_wrote(tmp_path):
    ds = dl.MapDataset.range(10).to_iter_dataset()
    ocp.save_checkpointables(tmp_path / "step", {"iter": iter(ds)})
    # What Grain's dataset iterator writes after three elements.
    (tmp_path / "step" / "iter" / state_filename(0, 1)).write_text(json.dumps({"next_index": 3}, indent=4))
    fresh = iter(ds)
    ocp.load_checkpointables(tmp_path / "step", {"iter": fresh})
    assert list(fresh) == list(range(3, 10))


def test_load_reads_process_0_of_another_process_count(tmp_path):
    it = loader_iterator()
    expected = as_lists(loader_iterator())
    next(it), next(it)
    ocp.save_checkpointables(tmp_path / "step", {"iter": it})
    item = tmp_path / "step" / "iter"
    (item / state_filename(0, 1)).rename(item / state_filename(0, 2))
    fresh = loader_iterator()
    ocp.load_checkpointables(tmp_path / "step", {"iter": fresh})
    assert as_lists(fresh) == expected[2:]


def cause(error: BaseException, kind: type) -> BaseException:
    """The ``kind`` error in ``error``'s chain (Orbax wraps what a load raises)."""
    while error is not None and not isinstance(error, kind):
        error = error.__cause__
    assert error is not None, f"no {kind.__name__} in the chain"
    return error


def test_load_without_a_state_for_this_process_names_the_files_it_found(tmp_path):
    it = loader_iterator()
    ocp.save_checkpointables(tmp_path / "step", {"iter": it})
    item = tmp_path / "step" / "iter"
    (item / state_filename(0, 1)).rename(item / "notes.json")
    with pytest.raises(Exception, match="Failed to load checkpointable: iter") as raised:
        ocp.load_checkpointables(tmp_path / "step", {"iter": loader_iterator()})
    assert "expected process_0-of-1.json, found no state files" in str(cause(raised.value, FileNotFoundError))


def test_load_into_another_loader_names_the_difference(tmp_path):
    ocp.save_checkpointables(tmp_path / "step", {"iter": loader_iterator()})
    other = iter(dl.DataLoader(dl.RangeDataSource(60), dl.IndexSampler(60, shuffle=True, seed=2, num_epochs=2),
                               [dl.Batch(4)]))
    with pytest.raises(Exception, match="Failed to load checkpointable: iter") as raised:
        ocp.load_checkpointables(tmp_path / "step", {"iter": other})
    assert "seed" in str(cause(raised.value, dl.StateMismatchError))


def test_an_async_save_keeps_the_state_of_the_call_while_the_loop_goes_on(tmp_path):
    expected = as_lists(loader_iterator())
    it = loader_iterator()
    next(it), next(it)
    pending = ocp.save_checkpointables_async(tmp_path / "step", {"iter": it})
    next(it), next(it)
    pending.result()
    fresh = loader_iterator()
    ocp.load_checkpointables(tmp_path / "step", {"iter": fresh})
    assert as_lists(fresh) == expected[2:]
