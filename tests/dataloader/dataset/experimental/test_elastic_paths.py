"""``ElasticIterator`` picks its path by what the dataset is, once, and says which.

The MaxText composition (Parquet files interleaved and window-shuffled) with and without
a filter, and Grain's own shape: an ``InterleaveIterDataset`` of datasets, whose shard
states are keyed by each dataset's index (the same calls as Grain's elastic iterator
tests). Every restore on another shard count hands out every element once.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import dataloader as dl
from dataloader.experimental import ElasticIterator, InterleaveIterDataset
from tests.dataloader.dataset.experimental.streams import Counted, run_on_shard_counts
from tests.dataloader.dataset.streams.test_parquet import key, write_files
from tests.dataloader.engine.elastic_cases import CHANGES, ISSUE_CHANGES

Parquet = dl.experimental.ParquetIterDataset
COUNTS = [7, 3, 12, 1, 9, 4]


def keep_some(row) -> bool:
    return int(row["row"]) % 3 != 1


def row_key(row) -> np.ndarray:
    return np.asarray(key(row), dtype=np.int64)


def maxtext(paths, keep=False):
    """MaxText's Parquet path: file order shuffled, files interleaved, rows window-shuffled."""
    files = dl.MapDataset.source(paths).shuffle(seed=5)
    ds = dl.experimental.WindowShuffleIterDataset(InterleaveIterDataset(files.map(Parquet), cycle_length=3),
                                                  window_size=10, seed=5)
    return (ds.filter(keep_some) if keep else ds).map(row_key)


def datasets(count, per=5):
    """Grain's test datasets: ``count`` streams of ``per`` consecutive integers."""
    return [dl.MapDataset.range(i * per, (i + 1) * per).to_iter_dataset() for i in range(count)]


def test_each_kind_of_dataset_takes_its_path(tmp_path):
    paths = write_files(tmp_path, COUNTS)
    shard = dl.ShardOptions(0, 2)
    stream = dl.MapDataset.range(20).to_iter_dataset()
    table = {
        "index": [dl.MapDataset.range(20), stream.map(lambda x: x + 1), maxtext(paths)],
        "shards": [stream.filter(lambda x: x % 2), maxtext(paths, keep=True),
                   dl.experimental.WindowShuffleIterDataset(stream, window_size=4, seed=1)],
        "interleave": [InterleaveIterDataset(datasets(4), cycle_length=2),
                       InterleaveIterDataset(datasets(4), cycle_length=2).map(lambda x: x * 2)],
    }
    for path, made in table.items():
        for ds in made:
            assert ElasticIterator(ds, 4, shard).path == path, ds
    with pytest.raises(ValueError, match=r"no elastic path for Counted\(\): .*no elastic path for other IterDatasets"):
        ElasticIterator(Counted([1, 2]), 2, shard)


def _maxtext_rows(paths, keep, phases, workers=0):
    mp = dl.MultiprocessingOptions(num_workers=workers) if workers else None

    def make(h, count):
        return ElasticIterator(maxtext(paths, keep), 6, dl.ShardOptions(h, count), multiprocessing_options=mp)

    return run_on_shard_counts(make, lambda batch: [tuple(k) for k in np.asarray(batch).tolist()], phases)


@pytest.mark.parametrize("change", ISSUE_CHANGES)
@pytest.mark.parametrize("keep", [False, True], ids=["without a filter", "with a filter"])
def test_the_maxtext_composition_restores_its_shard_states_on_other_counts(tmp_path, keep, change):
    """Without a filter it reads on the engine by index, with one by layout: either way
    Grain's get_shard_states/set_shard_states calls restore it, each row once (36 rows:
    the index path, which drops a last short global batch as Grain's does, drops none)."""
    paths = write_files(tmp_path, COUNTS)
    want = sorted((f, r) for f, n in enumerate(COUNTS) for r in range(n) if not keep or r % 3 != 1)
    assert sorted(_maxtext_rows(paths, keep, CHANGES[change])) == want


def test_the_maxtext_composition_restores_on_worker_processes(tmp_path):
    """The composition issue 33 found taking the index path silently, to fail there:
    on 2 worker processes through every change at once, each row once."""
    paths = write_files(tmp_path, COUNTS)
    want = sorted((f, r) for f, n in enumerate(COUNTS) for r in range(n))
    assert sorted(_maxtext_rows(paths, False, CHANGES["1->2->3->1"], workers=2)) == want


def test_grains_interleave_of_datasets_without_sharding():
    it = ElasticIterator(InterleaveIterDataset(datasets(3), cycle_length=3), 3, dl.NoSharding())
    assert [b.tolist() for b in it] == [[0, 5, 10], [1, 6, 11], [2, 7, 12], [3, 8, 13], [4, 9, 14]]
    it = ElasticIterator(InterleaveIterDataset(datasets(3), cycle_length=1), 1, dl.ShardOptions(0, 1))
    assert [b.tolist() for b in it] == [[x] for x in range(15)]


@pytest.mark.parametrize(("shard", "global_batch", "expected"), [
    ((0, 2), 2, [[0], [2], [4], [6], [8]]),
    ((1, 2), 0, [1, 3, 5, 7, 9]),  # 0: no batching, as in Grain
    ((0, 2), 4, [[0, 2], [4, 6], [8]]),
])
def test_grains_interleave_is_sliced_by_dataset(shard, global_batch, expected):
    parts = [dl.MapDataset.range(i, 10, 4).to_iter_dataset() for i in range(4)]
    it = ElasticIterator(InterleaveIterDataset(parts, cycle_length=2), global_batch, dl.ShardOptions(*shard))
    assert [np.asarray(b).tolist() for b in it] == expected


def _interleave(h, count, batch=4):
    parts = [dl.MapDataset.range(i, 100, 25).to_iter_dataset() for i in range(25)]
    return ElasticIterator(InterleaveIterDataset(parts, cycle_length=4).map(lambda x: x + 1), batch,
                           dl.ShardOptions(h, count))


def test_grains_shard_states_are_keyed_by_dataset_and_take_json_keys():
    it = _interleave(2, 4)
    for _ in range(4):
        next(it)
    states = it.get_shard_states()
    assert sorted(states) == list(range(2, 25, 4))  # this shard's datasets, by their index
    again = _interleave(2, 4)
    again.set_shard_states({str(k): v for k, v in json.loads(json.dumps(states)).items()})
    assert next(again).tolist() == next(it).tolist()


def test_the_interleaves_state_restores_at_every_step_and_after_close():
    it = _interleave(1, 2)
    states, outputs = [], []
    for batch in it:
        states.append(it.get_state())
        outputs.append(batch.tolist())
    it.close()
    for i, state in enumerate(states):
        it.set_state(state)  # after close(): a new stream, as in Grain
        assert [b.tolist() for b in it] == outputs[i + 1:]


@pytest.mark.parametrize("change", ISSUE_CHANGES)
def test_grains_interleave_restores_on_other_counts_with_every_element_once(change):
    used = run_on_shard_counts(lambda h, c: _interleave(h, c, 2 * c), lambda b: np.asarray(b).tolist(), CHANGES[change])
    assert sorted(used) == list(range(1, 101))


def test_a_dataset_read_to_its_end_is_not_read_again_after_a_restore():
    """Short datasets end while longer ones after them go on: on the new count their
    exhausted state keeps them closed."""
    parts = [dl.MapDataset.range(i * 10, i * 10 + n).to_iter_dataset() for i, n in enumerate([1, 6, 1, 6, 1, 6])]

    def make(h, count):
        return ElasticIterator(InterleaveIterDataset(parts, cycle_length=2), count, dl.ShardOptions(h, count))

    used = run_on_shard_counts(make, lambda b: np.asarray(b).tolist(), [(2, 2), (3, None)])
    assert sorted(used) == sorted(i * 10 + k for i, n in enumerate([1, 6, 1, 6, 1, 6]) for k in range(n))


def test_worker_processes_on_the_interleave_path_are_refused_as_in_grain():
    with pytest.raises(NotImplementedError, match="multiprocess prefetching"):
        ElasticIterator(InterleaveIterDataset(datasets(2), cycle_length=2), 2, dl.ShardOptions(0, 1),
                        multiprocessing_options=dl.MultiprocessingOptions(num_workers=1))


def test_a_state_of_another_shard_is_refused_on_the_interleave_path():
    """A state names only the datasets of its shard: restoring it into another shard (as
    a checkpoint read on another process count would) is refused, saying what to do."""
    it = _interleave(0, 2)
    next(it)
    with pytest.raises(dl.StateMismatchError, match=r"shard 0 of 2's and this ElasticIterator is shard 1 of 3"):
        _interleave(1, 3, 6).set_state(it.get_state())
