"""Parquet streams on the worker pool: ``ParquetIterDataset(...).map(f)`` and the calls
chained after it run in worker processes, unit by unit, and give the rows, the output and
the states of the stream read in order, for every worker count."""

from __future__ import annotations

import functools
import json
import os
import time

import numpy as np
import pyarrow.parquet as pq
import pytest

import dataloader as dl
from tests.dataloader.dataset.streams.test_parquet import key, write_files
from tests.helpers import assert_restores_everywhere, assert_streams_equal, take
from tests.integration.conftest import no_leaks  # noqa: F401  (autouse: no child or block left)

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(180)]

Parquet = dl.experimental.ParquetIterDataset
WORKERS = (0, 1, 2)


def on_workers(ds, workers):
    return ds.mp_prefetch(dl.MultiprocessingOptions(num_workers=workers))


def shards(folder, counts, row_group_size=3):
    """Files of ``counts`` rows each (different lengths), in row groups of 3."""
    return write_files(folder, counts, row_group_size)


def labelled(row):
    return {"key": np.array(key(row)), "text": row["text"].upper(), "tokens": row["tokens"] * 2}


def keyed(row):
    return {"key": np.array(key(row)), "text": row["text"]}


def keep_some(row):
    return int(row["row"]) % 3 != 1


def split_tokens(row):
    return [{"key": np.array([*key(row), i])} for i in range(int(row["row"]) % 3)]


@pytest.fixture(params=["one_file", "files_of_different_lengths"])
def paths(request, tmp_path):
    counts = [23] if request.param == "one_file" else [7, 3, 12, 1, 9, 4, 5, 2, 8, 6, 3, 3, 1, 10, 2, 4, 7, 5, 11]
    return shards(tmp_path, counts)


CHAINS = {
    "map": lambda ds: ds.map(labelled),
    "columns": lambda ds: ds.map(lambda row: sorted(row)),
    "filter_then_map": lambda ds: ds.filter(keep_some).map(labelled),
    "flat_map": lambda ds: ds.flat_map(split_tokens),
    "map_filter_batch": lambda ds: ds.map(keyed).filter(lambda e: e["key"][1] % 2 == 0).batch(3),
}


def reference(paths, chain, columns=None):
    """The chain at the iterator level, on the rows the stream yields in order in this
    process (the way it ran before it ran on the engine)."""
    in_order = dl.experimental.ThreadPrefetchIterDataset(Parquet(paths, columns=columns), prefetch_buffer_size=0)
    return list(CHAINS[chain](in_order))


def test_the_reference_is_the_chain_applied_to_the_rows_in_order(paths):
    rows = list(Parquet(paths))
    assert_streams_equal(reference(paths, "map"), [labelled(r) for r in rows])
    assert_streams_equal(reference(paths, "flat_map"), [e for r in rows for e in split_tokens(r)])


@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_every_element_is_the_streams_for_0_1_and_2_workers(paths, chain):
    columns = ["row", "file"] if chain == "columns" else None
    expected = reference(paths, chain, columns)
    assert expected
    for workers in WORKERS:
        ds = on_workers(CHAINS[chain](Parquet(paths, columns=columns)), workers)
        assert_streams_equal(list(ds), expected)


def test_the_worker_count_from_the_environment_changes_nothing(paths, monkeypatch):
    expected = reference(paths, "filter_then_map")
    monkeypatch.setenv("GRANARY_WORKER_COUNT", "2")
    assert_streams_equal(list(CHAINS["filter_then_map"](Parquet(paths))), expected)


def test_restores_at_every_step_in_process(paths):
    ds = Parquet(paths).filter(keep_some).flat_map(split_tokens)
    outputs = assert_restores_everywhere(lambda: iter(ds), limit=40, fresh_iterator_every=4)
    in_order = dl.experimental.ThreadPrefetchIterDataset(Parquet(paths), prefetch_buffer_size=0)
    assert_streams_equal(outputs, list(in_order.filter(keep_some).flat_map(split_tokens))[:40])


@pytest.mark.parametrize(("saved_with", "restored_with"), [(2, 0), (0, 2), (1, 2)])
def test_a_state_restores_under_another_worker_count(paths, saved_with, restored_with):
    chain = CHAINS["map_filter_batch"]
    expected = reference(paths, "map_filter_batch")
    with iter(on_workers(chain(Parquet(paths)), saved_with)) as it:
        states = []
        for _ in range(len(expected)):
            next(it)
            states.append(json.dumps(it.get_state()))
    states_again = []
    with iter(on_workers(chain(Parquet(paths)), restored_with)) as it:
        for _ in range(len(expected)):
            next(it)
            states_again.append(json.dumps(it.get_state()))
    assert states_again == states  # the same states, whatever the count
    for step in sorted({0, 1, len(states) // 2, len(states) - 2}):
        with iter(on_workers(chain(Parquet(paths)), restored_with)) as resumed:
            resumed.set_state(json.loads(states[step]))
            assert_streams_equal(list(resumed), expected[step + 1:])


def pid_and_key(parent, row):
    # In the test's process (a warm start computes the first units here while the
    # workers start), slow down, so that the workers take the rest of the stream.
    if os.getpid() == parent:
        time.sleep(0.01)
    return os.getpid(), key(row)


def test_a_worker_process_computes_the_map(tmp_path):
    paths = shards(tmp_path, [300, 200, 250], row_group_size=50)
    out = list(on_workers(Parquet(paths).map(functools.partial(pid_and_key, os.getpid())), 2))
    assert [k for _, k in out] == [key(r) for r in Parquet(paths)]
    assert {pid for pid, _ in out} - {os.getpid()}


def test_the_stream_alone_under_mp_prefetch_is_the_stream(paths):
    expected = list(Parquet(paths))
    for workers in WORKERS:
        assert_streams_equal(list(on_workers(Parquet(paths), workers)), expected)


def test_random_map_and_map_with_index_do_not_depend_on_the_worker_count(paths):
    def noisy(row, rng):
        return key(row), float(rng.random())

    outputs = [list(on_workers(Parquet(paths).seed(3).random_map(noisy).map_with_index(lambda i, e: (i, e)), w))
               for w in WORKERS]
    assert outputs[0] == outputs[1] == outputs[2]
    assert [i for i, _ in outputs[0]] == list(range(len(outputs[0])))
    assert [k for _, (k, _) in outputs[0]] == [key(r) for r in Parquet(paths)]


def test_states_of_the_streaming_iterators_continue_on_the_workers(paths):
    """A state saved while the stream ran in order (the file's or the interleave's, alone
    or under a map: Grain's and earlier granary checkpoints) continues at its row."""
    expected = [labelled(r) for r in Parquet(paths)]
    for step in (0, 1, 5, len(expected) // 2, len(expected)):
        streaming = iter(Parquet(paths))
        take(streaming, step)
        stage_state = {"parent": streaming.get_state(), "index": step, "skip": 0}
        for state in (streaming.get_state(), stage_state):
            with iter(on_workers(Parquet(paths).map(labelled), 2)) as resumed:
                resumed.set_state(json.loads(json.dumps(state)))
                assert_streams_equal(list(resumed), expected[step:])
        streaming.close()


def test_a_streaming_state_of_other_files_is_refused(tmp_path):
    paths = shards(tmp_path, [5, 6, 7])
    streaming = iter(Parquet(paths[0]))
    take(streaming, 2)
    it = iter(Parquet(paths[1]).map(labelled))
    with pytest.raises(dl.StateMismatchError, match=r"saved while reading the file 'other\.parquet', not 'shard-01\.parquet'"):
        it.set_state({**streaming.get_state(), "path": "other.parquet"})
    with pytest.raises(dl.StateMismatchError, match="state is of one Parquet file but this stream reads 3 files"):
        iter(Parquet(paths).map(labelled)).set_state(streaming.get_state())
    streaming.close()


def test_rows_are_read_a_row_group_at_a_time_in_workers_too(tmp_path, monkeypatch):
    paths = shards(tmp_path, [40], row_group_size=8)
    reads = []
    original = pq.ParquetFile.read_row_group
    monkeypatch.setattr(pq.ParquetFile, "read_row_group",
                        lambda self, i, *a, **k: reads.append(i) or original(self, i, *a, **k))
    assert len(list(Parquet(paths).map(labelled))) == 40
    assert reads == [0, 1, 2, 3, 4]
    reads.clear()
    (tmp_path / "several").mkdir()
    several = shards(tmp_path / "several", [40, 24, 33], row_group_size=8)  # units span the three files
    assert len(list(Parquet(several).map(labelled))) == 97
    assert sorted(reads) == sorted([*range(5), *range(3), *range(5)])  # each group of each file once


def maxtext_rows(paths, epochs=2, in_order=False):
    """MaxText's Parquet path: file order shuffled per epoch, files interleaved, rows
    window-shuffled; ``in_order``: kept at the iterator level, as it ran before."""
    files = dl.MapDataset.source(paths).shuffle(seed=5).repeat(epochs)
    ds = dl.experimental.InterleaveIterDataset(files.map(Parquet), cycle_length=3)
    ds = dl.experimental.WindowShuffleIterDataset(ds, window_size=10, seed=5)
    if in_order:
        ds = dl.experimental.ThreadPrefetchIterDataset(ds, prefetch_buffer_size=0)
    return ds


def test_maxtexts_composition_runs_on_the_workers_with_the_rows_it_had_in_order(tmp_path):
    paths = shards(tmp_path, [7, 3, 12, 1, 9])
    expected = list(maxtext_rows(paths, in_order=True).filter(keep_some).map(labelled))
    assert sorted(key(r) for r in maxtext_rows(paths, in_order=True)) == sorted(
        [(f, r) for f, n in enumerate([7, 3, 12, 1, 9]) for r in range(n)] * 2)
    for workers in WORKERS:
        ds = on_workers(maxtext_rows(paths).filter(keep_some).map(labelled), workers)
        assert type(ds).__name__ == "LoaderIterDataset"  # on the engine
        assert_streams_equal(list(ds), expected)


def test_maxtexts_composition_computes_the_map_in_a_worker(tmp_path):
    paths = shards(tmp_path, [300, 200, 250], row_group_size=50)
    out = list(on_workers(maxtext_rows(paths, epochs=1).map(functools.partial(pid_and_key, os.getpid())), 2))
    assert [k for _, k in out] == [key(r) for r in maxtext_rows(paths, epochs=1)]
    assert {pid for pid, _ in out} - {os.getpid()}


def test_states_of_maxtexts_composition_in_order_continue_on_the_workers(tmp_path):
    paths = shards(tmp_path, [7, 3, 12, 1, 9])
    expected = list(maxtext_rows(paths).map(labelled))
    in_order = maxtext_rows(paths, in_order=True).map(labelled)
    for step in (0, 1, 9, 10, 11, len(expected) // 2, len(expected) - 1):
        with iter(in_order) as streaming:
            take(streaming, step)
            state = json.loads(json.dumps(streaming.get_state()))
        with iter(on_workers(maxtext_rows(paths).map(labelled), 2)) as resumed:
            resumed.set_state(state)
            assert_streams_equal(list(resumed), expected[step:])


def test_what_has_no_random_access_form_stays_in_order(tmp_path):
    """An endless file list, or datasets that are not one Parquet file each, run at the
    iterator level, as before."""
    paths = shards(tmp_path, [4, 5])
    endless = dl.experimental.InterleaveIterDataset(dl.MapDataset.source(paths).repeat().map(Parquet), cycle_length=2)
    mixed = dl.experimental.InterleaveIterDataset([Parquet(paths[0]), dl.MapDataset.range(3).to_iter_dataset()],
                                                  cycle_length=2)
    several = dl.experimental.InterleaveIterDataset([Parquet(paths)], cycle_length=2)
    class OwnReading(Parquet):  # a subclass that reads its files its own way
        def __iter__(self):
            return iter(dl.MapDataset.source([{"file": 9, "row": 9}]).to_iter_dataset())

    for ds in (endless, mixed, several, OwnReading(paths)):
        assert type(ds.map(lambda x: x)).__name__ == "ElementwiseIterDataset"
    assert list(OwnReading(paths).map(key)) == [(9, 9)]
    assert take(iter(endless.map(key)), 12) == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2), (0, 3), (1, 3),
                                                (1, 4), (0, 0), (0, 1), (1, 0)]
