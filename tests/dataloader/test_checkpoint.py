"""The loader's state inside Orbax checkpoints (CheckpointManager, sync and async)."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from typing import Any

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


@pytest.mark.parametrize(("damage", "what"), [
    (lambda text: text[: len(text) // 2], r"it is not valid JSON at line \d+, column \d+ \(byte \d+ of \d+\)"),
    (lambda text: "", r"it is empty"),
    (lambda text: "\xff\xfe" + text, None),
    (lambda text: "[1, 2]", r"it holds b'\[1, 2\]', where a saved state is a JSON object"),
], ids=["cut short", "empty", "not text", "not an object"])
def test_a_damaged_state_file_in_a_committed_checkpoint_is_named_with_what_to_do(tmp_path, damage, what):
    it = iter(make_loader())
    take(it, 2)
    with manager(tmp_path, asynchronous=False) as mngr:
        save(mngr, 2, it)
    path = tmp_path / "2" / "data" / "process_0-of-1.json"
    if what is None:  # bytes that are not UTF-8
        path.write_bytes(b"\xff\xfe" + path.read_bytes())
        what = r"byte 0 of its \d+ is not UTF-8 text"
    else:
        path.write_text(damage(path.read_text()))
    with manager(tmp_path, asynchronous=False) as mngr, pytest.raises(
        ValueError,
        match=rf"the data-loader state file {re.escape(str(path))} is damaged: {what}.*; .*restore an earlier "
        r"step \(CheckpointManager\.restore\(step\)",
    ) as info:
        restore(mngr, 2, iter(make_loader()))
    assert not isinstance(info.value, json.JSONDecodeError)


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


# Grain's names: PyGrainCheckpointHandler, PyGrainCheckpointSave, PyGrainCheckpointRestore.


def grain_save(mngr: ocp.CheckpointManager, step: int, iterator) -> None:
    mngr.save(step, args=ocp.args.Composite(
        params=ocp.args.StandardSave({"w": np.arange(3.0)}), iter=dl.PyGrainCheckpointSave(iterator)))


def grain_restore(mngr: ocp.CheckpointManager, step: int, iterator):
    return mngr.restore(step, args=ocp.args.Composite(
        params=ocp.args.StandardRestore({"w": np.zeros(3)}), iter=dl.PyGrainCheckpointRestore(iterator)))


def dataset_iterator():
    ds = dl.MapDataset.range(40).seed(5).shuffle().map(lambda x: x * 3).to_iter_dataset().batch(4)
    return iter(ds)


def dataset_iterator_with_workers():
    ds = dl.MapDataset.range(40).seed(5).shuffle().map(lambda x: x * 3).to_iter_dataset().batch(4)
    return iter(ds.mp_prefetch(dl.MultiprocessingOptions(num_workers=2)))


def elastic_iterator(shard=(0, 1)):
    ds = dl.MapDataset.range(48).seed(2).shuffle()
    return dl.experimental.ElasticIterator(ds, 8, dl.ShardOptions(*shard))


GRAIN_ITERATORS = {
    "loader": lambda: iter(make_loader()),
    "dataset": dataset_iterator,
    "dataset-workers": pytest.param(dataset_iterator_with_workers, marks=pytest.mark.multiprocess),
    "elastic": elastic_iterator,
    "device": lambda: dl.device_prefetch(iter(make_loader()), cpu_buffer_size=2, device_buffer_size=2),
}


def as_lists(batches):
    return [np.asarray(b).tolist() for b in batches]


@pytest.mark.parametrize("make", list(GRAIN_ITERATORS.values()), ids=list(GRAIN_ITERATORS))
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_grain_args_restore_every_batch_after_the_step(tmp_path, make, asynchronous):
    with make() as whole:
        expected = as_lists(whole)
    it = make()
    with manager(tmp_path, asynchronous) as mngr:
        take(it, 3)
        grain_save(mngr, 3, it)
        take(it, 2)  # the loop goes on; the checkpoint keeps step 3
        mngr.wait_until_finished()
    it.close()
    with manager(tmp_path, asynchronous) as mngr, make() as fresh:
        restored = grain_restore(mngr, mngr.latest_step(), fresh)
        assert restored.iter is fresh
        assert as_lists(restored.iter) == expected[3:]
    assert len(expected) > 5


def test_grain_handler_writes_grain_file_names_with_indented_json(tmp_path):
    it = iter(make_loader())
    take(it, 2)
    with manager(tmp_path, asynchronous=False) as mngr:
        grain_save(mngr, 2, it)
    path = tmp_path / "2" / "iter" / "process_0-of-1.json"
    assert json.loads(path.read_text()) == it.get_state()
    assert path.read_text().startswith('{\n    "version"')


def test_grain_handler_restore_without_an_iterator_returns_the_state(tmp_path):
    it = iter(make_loader())
    take(it, 4)
    handler = dl.PyGrainCheckpointHandler()
    handler.save(tmp_path, args=dl.PyGrainCheckpointSave(it))
    assert handler.restore(tmp_path, args=dl.PyGrainCheckpointRestore(None)) == it.get_state()


def test_grain_handler_takes_the_item_argument_of_the_older_orbax_api(tmp_path):
    loader = make_loader()
    it = iter(loader)
    take(it, 5)
    handler = dl.PyGrainCheckpointHandler()
    handler.save(tmp_path, it)
    fresh = handler.restore(tmp_path, iter(loader))
    assert_streams_equal(list(fresh), list(it))


def test_grain_handler_missing_file_is_a_value_error_naming_what_is_there(tmp_path):
    (tmp_path / "other.json").write_text("{}")
    with pytest.raises(ValueError, match=r"expected process_0-of-1\.json, found no state files"):
        dl.PyGrainCheckpointHandler().restore(tmp_path, args=dl.PyGrainCheckpointRestore(iter(make_loader())))


def test_grain_handler_save_without_an_iterator_says_what_to_pass(tmp_path):
    with pytest.raises(ValueError, match=r"pass args=PyGrainCheckpointSave\(iterator\)"):
        dl.PyGrainCheckpointHandler().save(tmp_path, args=None)
    with pytest.raises(TypeError, match=r"PyGrainCheckpointHandler.save needs an iterator with get_state"):
        dl.PyGrainCheckpointHandler().save(tmp_path, args=dl.PyGrainCheckpointSave([1, 2]))


def test_grain_handler_restore_refuses_a_state_of_another_loader(tmp_path):
    it = iter(make_loader(seed=1))
    take(it, 2)
    dl.PyGrainCheckpointHandler().save(tmp_path, it)
    with pytest.raises(dl.StateMismatchError, match=r"process_0-of-1\.json: .*seed=1 but this loader has seed=2"):
        dl.PyGrainCheckpointHandler().restore(tmp_path, iter(make_loader(seed=2)))


def test_grain_names_are_on_dataloader_and_its_checkpoint_module():
    import dataloader.checkpoint as checkpoint

    for name in ("PyGrainCheckpointHandler", "PyGrainCheckpointSave", "PyGrainCheckpointRestore"):
        assert getattr(dl, name) is getattr(checkpoint, name)
    assert issubclass(dl.PyGrainCheckpointHandler, ocp.CheckpointHandler)
    assert not issubclass(dl.PyGrainCheckpointHandler, ocp.AsyncCheckpointHandler)


def test_elastic_iterator_restores_on_another_process_count_through_grain_handler(tmp_path):
    """Two shards save; one process restores process 0's file and continues the global batches."""
    shards = [elastic_iterator((h, 2)) for h in range(2)]
    for h, it in enumerate(shards):
        take(it, 2)
        (tmp_path / state_filename(h, 2)).write_text(json.dumps(it.get_state()))
    single = dl.PyGrainCheckpointHandler().restore(tmp_path, elastic_iterator((0, 1)))
    for _ in range(3):
        global_batch = np.concatenate([next(it) for it in shards])
        assert sorted(next(single).tolist()) == sorted(global_batch.tolist())


# A subclass written the way MaxText's GrainCheckpointHandler is (maxtext
# src/maxtext/common/grain_utility.py): it overrides save/restore with Grain's
# signatures, names the files itself from process index and count (a list of
# (iterator, process_index, process_count) when one host feeds several shards), reads
# its own extra restore args, and registers its own args classes.


class ShardedGrainHandler(dl.PyGrainCheckpointHandler, ocp.CheckpointHandler):
    def save(self, directory, item=None, args=None):
        item = item or args.item
        if not isinstance(item, list):
            return super().save(directory, item=item)
        for iterator, index, count in item:
            state = json.dumps(iterator.get_state(), indent=4) if isinstance(iterator, dl.DatasetIterator) \
                else iterator.get_state().decode()
            (directory / f"process_{index}-of-{count}.json").write_text(state)
        return None

    def restore(self, directory, item=None, args=None):
        item = item or args.item
        indices, count = getattr(args, "process_index", None), getattr(args, "process_count", None)
        if not isinstance(item, list):
            return super().restore(directory, item=item, args=args)
        restored = []
        for iterator, index in zip(item, indices):
            filename = directory / f"process_{index}-of-{count}.json"
            if not filename.exists():
                raise ValueError(f"File {filename} does not exist.")
            iterator.set_state(json.loads(filename.read_text()))
            restored.append(iterator)
        return restored


@ocp.args.register_with_handler(ShardedGrainHandler, for_save=True)
@dataclasses.dataclass
class ShardedSave(ocp.args.CheckpointArgs):
    item: Any


@ocp.args.register_with_handler(ShardedGrainHandler, for_restore=True)
@dataclasses.dataclass
class ShardedRestore(ocp.args.CheckpointArgs):
    item: Any
    process_index: int | list[int] | None = None
    process_count: int | None = None


def test_a_maxtext_style_subclass_saves_a_list_of_shards_and_restores_them(tmp_path):
    def shard(h):
        return iter(make_loader(shard=(h, 2)))

    expected = [as_lists(shard(h)) for h in range(2)]
    iterators = [shard(0), shard(1)]
    for it in iterators:
        take(it, 3)
    options = ocp.CheckpointManagerOptions(enable_async_checkpointing=True)
    with ocp.CheckpointManager(tmp_path, options=options, item_handlers={"iter": ShardedGrainHandler()}) as mngr:
        mngr.save(3, args=ocp.args.Composite(iter=ShardedSave([(it, h, 2) for h, it in enumerate(iterators)])))
        mngr.wait_until_finished()
    names = sorted(p.name for p in (tmp_path / "3" / "iter").iterdir() if p.suffix == ".json")
    assert names == ["process_0-of-2.json", "process_1-of-2.json"]
    with ocp.CheckpointManager(tmp_path, options=options, item_handlers={"iter": ShardedGrainHandler()}) as mngr:
        restored = mngr.restore(3, args=ocp.args.Composite(
            iter=ShardedRestore([shard(0), shard(1)], process_index=[0, 1], process_count=2)))
    assert [as_lists(it) for it in restored.iter] == [e[3:] for e in expected]


def test_a_maxtext_style_subclass_falls_back_to_grain_handler_for_one_iterator(tmp_path):
    it = dataset_iterator()
    expected = as_lists(dataset_iterator())
    take(it, 4)
    with ocp.CheckpointManager(tmp_path, item_handlers={"iter": ShardedGrainHandler()}) as mngr:
        mngr.save(4, args=ocp.args.Composite(iter=ShardedSave(it)))
        mngr.wait_until_finished()
        restored = mngr.restore(4, args=ocp.args.Composite(iter=ShardedRestore(dataset_iterator())))
    assert as_lists(restored.iter) == expected[4:]


# States written by the real Grain (grain 0.2.18, orbax CheckpointManager with
# grain.python.PyGrainCheckpointSave): DataLoader(RangeDataSource(0, 30, 1),
# IndexSampler(30, ...), [Batch(5)]), saved after a few steps.


def grain_dataloader_state(last_seen, sampler, worker_count=0):
    seen = {str(i): v for i, v in enumerate(last_seen)}
    return json.dumps({
        "version": 2, "last_seen_indices": seen, "last_worker_index": -1,
        "worker_count": worker_count, "sampler": sampler,
        "data_source": "RangeDataSource(start=0, stop=30, step=1)",
    }, indent=4)


def grain_sampler(shuffle, seed, shard=(0, 1)):
    return (f"IndexSampler(num_records=30, shard_options=ShardOptions(shard_index={shard[0]}, "
            f"shard_count={shard[1]}, drop_remainder=False), shuffle={shuffle}, num_epochs=2, seed={seed})")


def loader_30(shuffle, seed, shard=(0, 1)):
    sampler = dl.IndexSampler(30, dl.ShardOptions(*shard), shuffle=shuffle, seed=seed, num_epochs=2)
    return dl.DataLoader(dl.RangeDataSource(30), sampler, [dl.Batch(5)])


def test_a_state_of_grain_dataloader_continues_with_the_batches_grain_gives(tmp_path):
    """Unshuffled and unsharded, Grain's next batches after 2 steps were [10..14], [15..19]."""
    (tmp_path / "process_0-of-1.json").write_text(grain_dataloader_state([9], grain_sampler(False, None)))
    it = dl.PyGrainCheckpointHandler().restore(tmp_path, args=dl.PyGrainCheckpointRestore(iter(loader_30(False, None))))
    assert as_lists(take(it, 2)) == [[10, 11, 12, 13, 14], [15, 16, 17, 18, 19]]
    assert it.get_state()["position"] == 20


def test_a_grain_state_at_an_epoch_end_restores_into_the_next_epoch(tmp_path):
    (tmp_path / "process_0-of-1.json").write_text(grain_dataloader_state([29], grain_sampler(True, 7)))
    loader = loader_30(True, 7)
    it = dl.IteratorCheckpointHandler().restore(tmp_path, dl.CheckpointRestore(iter(loader)))
    assert_streams_equal(list(it), list(loader)[6:])


def test_a_sharded_grain_state_at_its_epoch_end_restores_into_the_next_epoch(tmp_path):
    (tmp_path / "process_0-of-1.json").write_text(grain_dataloader_state([29], grain_sampler(False, None, (1, 2))))
    loader = loader_30(False, None, (1, 2))
    it = dl.PyGrainCheckpointHandler().restore(tmp_path, iter(loader))
    assert_streams_equal(list(it), list(loader)[3:])


@pytest.mark.parametrize(
    ("state", "message"),
    [
        (grain_dataloader_state([9], grain_sampler(True, 7)), r"middle of a shuffled epoch \(local position 10\)"),
        (grain_dataloader_state([8, 9], grain_sampler(True, 7), worker_count=2), r"worker_count=2: Grain's DataLoader"),
        (grain_dataloader_state([29], grain_sampler(True, 8)), r"seed=8 but this iterator has seed=7"),
        (json.dumps({"next_index": 12}), r"Grain dataset-iterator state \(\{'next_index': 12\}\): its index counts elements in Grain's shuffle order"),
    ],
    ids=["mid-epoch", "two-workers", "other-seed", "dataset-iterator"],
)
def test_a_grain_state_that_cannot_continue_exactly_is_refused(tmp_path, state, message):
    (tmp_path / "process_0-of-1.json").write_text(state)
    with pytest.raises(dl.StateMismatchError, match=r"process_0-of-1\.json: .*" + message):
        dl.PyGrainCheckpointHandler().restore(tmp_path, iter(loader_30(True, 7)))
