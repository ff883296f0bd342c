"""ParquetIterDataset: Grain's cases, rows as ParquetDataSource gives them, a row group
decoded once, restores at every step, MaxText's file-shuffled composition, bad files named
at construction, and no file left open."""

from __future__ import annotations

import json
import pathlib
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dataloader as dl
from tests.helpers import (
    assert_restores_everywhere,
    assert_streams_equal,
    open_files_under,
    wait_until,
)

Parquet = dl.experimental.ParquetIterDataset

# Grain's test texts (parquet_dataset_test.py): two files of four rows, row groups of 2.
SOME_TEXT = [[f"This is the {f} file the {r} record" for r in ("first", "second", "third", "forth")]
             for f in ("first", "second")]


@pytest.fixture
def two_files(tmp_path):
    paths = []
    for i, texts in enumerate(SOME_TEXT):
        paths.append(str(tmp_path / f"text-{i}.parquet"))
        pq.write_table(pa.table({"text": texts}), paths[-1], row_group_size=2)
    return paths


def write_shards(folder, count=5, rows=23, row_group_size=4) -> list[str]:
    """``count`` files of ``rows`` rows: file number, row number, a string and a token list."""
    return write_files(folder, [rows] * count, row_group_size)


def write_files(folder, counts, row_group_size=4) -> list[str]:
    """Files ``shard-NN.parquet`` of ``counts[NN]`` rows, as :func:`write_shards` writes them."""
    paths = []
    for f, rows in enumerate(counts):
        table = pa.table({
            "file": [f] * rows,
            "row": list(range(rows)),
            "text": [f"f{f}r{r}" for r in range(rows)],
            "tokens": [list(range(r % 5)) for r in range(rows)],
        })
        paths.append(str(folder / f"shard-{f:02d}.parquet"))
        pq.write_table(table, paths[-1], row_group_size=row_group_size)
    return paths


def key(row) -> tuple[int, int]:
    return int(row["file"]), int(row["row"])


def test_one_file_reads_its_rows_in_order(two_files):
    assert list(Parquet(two_files[0])) == [{"text": t} for t in SOME_TEXT[0]]


def test_several_files_are_interleaved_as_in_grain(two_files):
    interleaved = [t for pair in zip(*SOME_TEXT) for t in pair]
    assert list(Parquet(two_files)) == [{"text": t} for t in interleaved]
    ds = dl.experimental.InterleaveIterDataset(dl.MapDataset.source(two_files).map(Parquet), cycle_length=2)
    assert list(ds) == [{"text": t} for t in interleaved]


def test_set_slice_keeps_some_files_as_in_grain(two_files):
    ds = Parquet(two_files)
    ds.set_slice(slice(1, 2))
    assert list(ds) == [{"text": t} for t in SOME_TEXT[1]]
    ds.set_slice(slice(1, None))
    assert list(ds) == []


def test_rows_are_those_of_parquet_data_source(tmp_path):
    paths = write_shards(tmp_path, count=1, rows=11)
    source = dl.ParquetDataSource(paths[0])
    assert_streams_equal(list(Parquet(paths[0])), [source[i] for i in range(11)])
    assert list(Parquet(paths[0], columns=["text"])) == [{"text": f"f0r{r}"} for r in range(11)]


def test_keyword_arguments_go_to_parquet_file_as_in_grain(tmp_path):
    pq.write_table(pa.table({"id": [1, 2], "val": ["A", "B"]}), tmp_path / "kw.parquet")
    assert list(Parquet(str(tmp_path / "kw.parquet"), memory_map=True)) == [{"id": 1, "val": "A"}, {"id": 2, "val": "B"}]
    with pytest.raises(TypeError, match="no_such_option"):
        Parquet(str(tmp_path / "kw.parquet"), no_such_option=True)


def test_each_row_group_is_decoded_once_never_a_row_at_a_time(tmp_path, monkeypatch):
    paths = write_shards(tmp_path, count=1, rows=23, row_group_size=4)
    reads = []
    original = pq.ParquetFile.read_row_group
    monkeypatch.setattr(pq.ParquetFile, "read_row_group",
                        lambda self, i, *a, **k: reads.append(i) or original(self, i, *a, **k))
    it = iter(Parquet(paths[0]))
    next(it)
    assert wait_until(lambda: reads == [0, 1])  # the next row group is read while this one is handed out
    assert len([next(it) for _ in range(22)]) == 22
    assert reads == [0, 1, 2, 3, 4, 5]
    it.close()


@pytest.mark.parametrize(("count", "rows"), [(1, 7), (3, 7), (20, 3)])  # 20: more files than 16 open
def test_it_restores_at_every_step(tmp_path, count, rows):
    paths = write_shards(tmp_path, count=count, rows=rows, row_group_size=2)
    ds = Parquet(paths)
    outputs = assert_restores_everywhere(lambda: iter(ds), limit=rows * count + 1, fresh_iterator_every=3)
    assert sorted(map(key, outputs)) == [(f, r) for f in range(count) for r in range(rows)]


def test_a_state_is_a_file_and_a_position(tmp_path):
    paths = write_shards(tmp_path, count=1, rows=10, row_group_size=4)
    it = iter(Parquet(paths[0]))
    for _ in range(6):
        next(it)
    assert it.get_state() == {"path": "shard-00.parquet", "row_group": 1, "index_within_row_group": 2}
    (tmp_path / "other").mkdir()
    other = iter(Parquet(write_shards(tmp_path / "other", count=2)[1]))
    with pytest.raises(dl.StateMismatchError, match=r"saved while reading the file 'shard-00\.parquet', not 'shard-01"):
        other.set_state(it.get_state())


def maxtext_pipeline(paths, epochs=2, workers=0):
    """MaxText's Parquet path: file order shuffled per epoch, files interleaved, rows
    window-shuffled (then batched, under mp_prefetch)."""
    files = dl.MapDataset.source(paths).shuffle(seed=7).repeat(epochs)
    ds = dl.experimental.InterleaveIterDataset(files.map(Parquet), cycle_length=len(files) // epochs)
    ds = dl.experimental.WindowShuffleIterDataset(ds, window_size=12, seed=7)
    return ds.map(lambda row: np.array(key(row))).batch(4).mp_prefetch(dl.MultiprocessingOptions(num_workers=workers))


def test_maxtexts_composition_shuffles_the_files_per_epoch_and_restores(tmp_path):
    paths = write_shards(tmp_path, count=4, rows=9)
    rows = [tuple(r) for b in maxtext_pipeline(paths, epochs=3) for r in b.tolist()]
    epochs = [rows[i:i + 36] for i in range(0, 108, 36)]
    assert all(sorted(e) == [(f, r) for f in range(4) for r in range(9)] for e in epochs)
    files = dl.MapDataset.source(paths).shuffle(seed=7).repeat(3)
    orders = [tuple(files[i] for i in range(e * 4, e * 4 + 4)) for e in range(3)]
    assert all(sorted(o) == paths for o in orders) and len(set(orders)) == 3  # a file order per epoch
    again = [tuple(r) for b in maxtext_pipeline(paths, epochs=3) for r in b.tolist()]
    assert again == rows
    assert_restores_everywhere(lambda: iter(maxtext_pipeline(paths)), limit=20, fresh_iterator_every=4)


def test_maxtexts_composition_does_not_depend_on_the_worker_count(tmp_path):
    """The composition runs on the workers unit by unit, so num_workers does not change a row."""
    paths = write_shards(tmp_path, count=4, rows=9)
    outputs = [list(maxtext_pipeline(paths, workers=w)) for w in (0, 1, 2)]
    assert_streams_equal(outputs[0], outputs[1])
    assert_streams_equal(outputs[0], outputs[2])
    it = iter(maxtext_pipeline(paths, workers=2))
    [next(it) for _ in range(3)]
    state = json.loads(json.dumps(it.get_state()))
    it.close()
    resumed = iter(maxtext_pipeline(paths, workers=0))
    resumed.set_state(state)
    assert_streams_equal(list(resumed), outputs[0][3:])


def test_a_file_that_is_not_parquet_is_named_at_construction(tmp_path):
    (tmp_path / "bad.parquet").write_bytes(b"this is not parquet at all")
    with pytest.raises(ValueError, match=r"bad\.parquet' is not a readable Parquet file"):
        Parquet(str(tmp_path / "bad.parquet"))
    with pytest.raises(FileNotFoundError, match=r"missing-\*\.parquet' matches no file"):
        Parquet(str(tmp_path / "missing-*.parquet"))
    paths = write_shards(tmp_path, count=1)
    with pytest.raises(ValueError, match=r"column 'nope' is not in Parquet file .*shard-00"):
        Parquet(paths, columns=["nope"])
    with pytest.raises(TypeError, match="columns must be a list of column names"):
        Parquet(paths, columns="text")


def test_a_file_cut_short_after_construction_fails_with_its_name(tmp_path):
    paths = write_shards(tmp_path, count=1, rows=40, row_group_size=4)
    ds = Parquet(paths[0])
    data = pathlib.Path(paths[0]).read_bytes()
    pathlib.Path(paths[0]).write_bytes(data[: len(data) // 3])
    with pytest.raises((ValueError, OSError), match=r"shard-00\.parquet"):
        list(ds)


def test_no_file_or_thread_is_left_open_after_close(tmp_path):
    paths = write_shards(tmp_path, count=20, rows=9)
    before = set(threading.enumerate())
    it = iter(Parquet(paths))
    for _ in range(30):
        next(it)
    assert open_files_under(tmp_path)
    it.close()
    assert not open_files_under(tmp_path)
    assert wait_until(lambda: set(threading.enumerate()) <= before)


def test_closing_a_window_shuffle_closes_the_files_below_it(tmp_path):
    paths = write_shards(tmp_path, count=3, rows=9)
    files = dl.MapDataset.source(paths).shuffle(seed=1)
    ds = dl.experimental.WindowShuffleIterDataset(
        dl.experimental.InterleaveIterDataset(files.map(Parquet), cycle_length=2), window_size=5, seed=1)
    with iter(ds) as it:
        next(it)
        assert open_files_under(tmp_path)
    assert not open_files_under(tmp_path)

