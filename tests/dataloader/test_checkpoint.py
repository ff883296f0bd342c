"""The loader's state inside Orbax checkpoints (CheckpointManager, sync and async)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import orbax.checkpoint as ocp
import pytest

import dataloader as dl
from dataloader.checkpoint import find_state_file, state_filename
from tests.helpers import REPO_ROOT, assert_streams_equal, take, wait_full

ROOT = REPO_ROOT


def make_loader(seed: int = 1, batch_size: int = 4, shard: tuple[int, int] = (0, 1)) -> dl.DataLoader:
    sampler = dl.IndexSampler(
        60, dl.ShardOptions(*shard), shuffle=True, seed=seed, num_epochs=2
    )
    return dl.DataLoader(dl.RangeDataSource(60), sampler, [dl.Batch(batch_size)])


def manager(directory, asynchronous: bool) -> ocp.CheckpointManager:
    options = ocp.CheckpointManagerOptions(enable_async_checkpointing=asynchronous)
    return ocp.CheckpointManager(directory, options=options)


def save(mngr: ocp.CheckpointManager, step: int, iterator, params=None) -> None:
    params = {"w": np.arange(3.0)} if params is None else params
    mngr.save(
        step,
        args=ocp.args.Composite(
            params=ocp.args.StandardSave(params), data=dl.CheckpointSave(iterator)
        ),
    )


def restore(mngr: ocp.CheckpointManager, step: int, iterator):
    return mngr.restore(
        step,
        args=ocp.args.Composite(
            params=ocp.args.StandardRestore({"w": np.zeros(3)}),
            data=dl.CheckpointRestore(iterator),
        ),
    )


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_restore_continues_the_stream(tmp_path, asynchronous):
    loader = make_loader()
    expected = list(loader)
    it = iter(loader)
    with manager(tmp_path, asynchronous) as mngr:
        take(it, 7)
        save(mngr, 7, it)
        mngr.wait_until_finished()
    with manager(tmp_path, asynchronous) as mngr:
        restored = restore(mngr, mngr.latest_step(), iter(loader))
    assert_streams_equal(list(restored.data), expected[7:])
    np.testing.assert_array_equal(restored.params["w"], np.arange(3.0))


def test_async_save_keeps_the_state_of_the_call(tmp_path):
    """The iterator moving on while Orbax writes in the background changes nothing."""
    loader = make_loader()
    expected = list(loader)
    it = iter(loader)
    with manager(tmp_path, asynchronous=True) as mngr:
        take(it, 3)
        save(mngr, 3, it)
        take(it, 10)  # the training loop goes on before the commit finishes
        mngr.wait_until_finished()
        restored = restore(mngr, 3, iter(loader))
    assert_streams_equal(list(restored.data), expected[3:])


def test_each_process_writes_its_own_json_file(tmp_path):
    it = iter(make_loader())
    take(it, 2)
    with manager(tmp_path, asynchronous=False) as mngr:
        save(mngr, 2, it)
    files = sorted(p.name for p in (tmp_path / "2" / "data").iterdir() if p.suffix == ".json")
    assert files == ["process_0-of-1.json"]
    assert json.loads((tmp_path / "2" / "data" / files[0]).read_text()) == it.get_state()


def test_restore_into_a_loader_it_does_not_fit_names_the_difference(tmp_path):
    it = iter(make_loader(seed=1))
    take(it, 2)
    with manager(tmp_path, asynchronous=False) as mngr:
        save(mngr, 2, it)
        with pytest.raises(
            dl.StateMismatchError, match=r"process_0-of-1\.json: .*seed=1 but this loader has seed=2"
        ):
            restore(mngr, 2, iter(make_loader(seed=2)))


def test_restore_without_an_iterator_returns_the_state(tmp_path):
    it = iter(make_loader())
    take(it, 5)
    with manager(tmp_path, asynchronous=False) as mngr:
        save(mngr, 5, it)
        restored = mngr.restore(5, args=ocp.args.Composite(data=dl.CheckpointRestore()))
    assert restored.data == it.get_state()


class CountingIterator:
    """Not a DataLoaderIterator: anything with get_state/set_state checkpoints."""

    def __init__(self) -> None:
        self.n = 0

    def __next__(self) -> int:
        self.n += 1
        return self.n

    def get_state(self) -> dict:
        return {"n": self.n}

    def set_state(self, state: dict) -> None:
        self.n = state["n"]


def test_any_iterator_with_get_state_and_set_state_checkpoints(tmp_path):
    it = CountingIterator()
    for _ in range(4):
        next(it)
    with manager(tmp_path, asynchronous=True) as mngr:
        mngr.save(4, args=ocp.args.Composite(data=dl.CheckpointSave(it)))
        mngr.wait_until_finished()
        restored = mngr.restore(4, args=ocp.args.Composite(data=dl.CheckpointRestore(CountingIterator())))
    assert next(restored.data) == 5


def test_save_args_refuse_an_object_without_get_state():
    with pytest.raises(TypeError, match=r"CheckpointSave needs an iterator with get_state\(\)"):
        dl.CheckpointSave([1, 2, 3])


def test_elastic_restore_reads_process_0_of_another_process_count(tmp_path):
    """A state saved by 2 processes (batch 4 each) restores on 1 process at batch 8."""
    shards = [iter(make_loader(batch_size=4, shard=(h, 2))) for h in range(2)]
    for h, it in enumerate(shards):
        take(it, 3)
        (tmp_path / state_filename(h, 2)).write_text(json.dumps(it.get_state()))
    handler = dl.IteratorCheckpointHandler()
    single = handler.restore(tmp_path, dl.CheckpointRestore(iter(make_loader(batch_size=8))))
    for _ in range(4):
        global_batch = np.concatenate([next(it) for it in shards])
        assert sorted(next(single).tolist()) == sorted(global_batch.tolist())


def test_a_missing_file_for_the_same_process_count_is_an_error(tmp_path):
    (tmp_path / state_filename(0, 2)).write_text("{}")
    with pytest.raises(FileNotFoundError, match=r"expected process_1-of-2\.json, found \['process_0-of-2\.json'\]"):
        find_state_file(tmp_path, 1, 2)


def test_import_dataloader_does_not_import_orbax_or_jax():
    """Worker processes import dataloader; Orbax and JAX load only when a checkpoint name is used."""
    code = "import sys, dataloader; print(sorted(m for m in ('jax', 'orbax.checkpoint', 'yaml') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_device_iterator_saves_the_state_of_the_last_batch_it_yielded(tmp_path):
    loader = make_loader()
    expected = list(loader)
    with dl.device_prefetch(iter(loader), cpu_buffer_size=3, device_buffer_size=2) as it:
        take(it, 5)
        wait_full(it)  # both buffers hold batches beyond the fifth
        with manager(tmp_path, asynchronous=True) as mngr:
            save(mngr, 5, it)
            mngr.wait_until_finished()
    with dl.device_prefetch(iter(loader)) as fresh, manager(tmp_path, asynchronous=True) as mngr:
        restored = restore(mngr, 5, fresh)
        rest = [np.asarray(b).tolist() for b in restored.data]  # JAX makes int64 int32
    assert rest == [b.tolist() for b in expected[5:]]
