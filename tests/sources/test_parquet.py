"""Tests for ParquetDataSource."""

from __future__ import annotations

import multiprocessing
import os
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dataloader.sources.parquet
from dataloader.sources import ParquetDataSource, RandomAccessDataSource
from tests.sources._child import read_in_child
from tests.sources._data import parquet_table


@pytest.fixture
def two_files(make_parquet):
    """Files of 10 rows (row groups 4, 4, 2) and 6 rows (4, 2): 5 row groups."""
    return [make_parquet("a.parquet", 10, 0), make_parquet("b.parquet", 6, 1)]


def _expected_row(index: int) -> dict:
    file_number, row = (0, index) if index < 10 else (1, index - 10)
    return parquet_table(file_number, row + 1).slice(row).to_pylist()[0]


def _assert_row_equal(actual: dict, expected: dict) -> None:
    assert list(actual) == list(expected)
    for name, value in expected.items():
        if isinstance(actual[name], np.ndarray):
            np.testing.assert_array_equal(actual[name], value)
        else:
            assert actual[name] == value, name


def test_rows_round_trip_across_row_groups_and_files(two_files):
    source = ParquetDataSource(two_files)
    assert len(source) == 16
    for i in range(16):
        _assert_row_equal(source[i], _expected_row(i))


def test_record_location_names_the_file_row_group_and_row(two_files):
    source = dataloader.sources.parquet.ParquetDataSource(two_files)
    assert source.record_location(9) == f"file {str(two_files[0])!r} (row group 2, row 1)"
    assert source.record_location(14) == f"file {str(two_files[1])!r} (row group 1, row 0)"


def test_source_satisfies_protocol(two_files):
    assert isinstance(ParquetDataSource(two_files), RandomAccessDataSource)


def test_value_types_follow_the_documented_mapping(two_files):
    row = ParquetDataSource(two_files)[1]
    assert type(row["id"]) is np.int64
    assert type(row["score"]) is np.float32
    assert type(row["flag"]) is np.bool_
    assert type(row["name"]) is str
    assert type(row["blob"]) is bytes
    assert isinstance(row["tokens"], np.ndarray)
    assert row["tokens"].dtype == np.int32
    assert row["tokens"].ndim == 1
    assert type(row["maybe"]) is np.int16


def test_nulls_are_none(two_files):
    assert ParquetDataSource(two_files)[3]["maybe"] is None


def test_null_list_is_none_and_empty_list_is_empty_array(tmp_path):
    path = tmp_path / "lists.parquet"
    pq.write_table(pa.table({"l": pa.array([[1.5], None, []], pa.list_(pa.float64()))}), path)
    source = ParquetDataSource(path)
    assert source[1]["l"] is None
    assert source[2]["l"].shape == (0,)
    np.testing.assert_array_equal(source[0]["l"], [1.5])


def test_rows_in_bulk_are_the_rows_one_at_a_time():
    from dataloader.sources._parquet_rows import DecodedRowGroup
    from tests.helpers import assert_streams_equal
    from tests.sources._data import parquet_table

    table = parquet_table(2, 30)
    table = table.append_column("text", pa.array([None if i % 4 == 1 else f"t{i}" for i in range(30)]))
    group = DecodedRowGroup(table)
    for start, stop in [(0, 30), (7, 19), (29, 30), (5, 5)]:
        bulk = group.rows(start, stop)
        assert_streams_equal(bulk, [group.row(i) for i in range(start, stop)])
        assert [type(r["id"]) for r in bulk] == [np.int64] * (stop - start)


def test_columns_selects_and_orders_row_keys(two_files):
    row = ParquetDataSource(two_files, columns=["name", "id"])[12]
    assert row == {"name": "row1002", "id": 1002}
    assert list(row) == ["name", "id"]


def test_getitems_keeps_order_and_duplicates_across_files(two_files):
    indices = np.array([15, 0, 9, 10, 0, 4], dtype=np.int64)
    rows = ParquetDataSource(two_files).__getitems__(indices)
    assert [row["id"] for row in rows] == [1005, 0, 9, 1000, 0, 4]


def test_getitems_decodes_each_row_group_once(two_files, monkeypatch):
    decoded = []
    real = dataloader.sources.parquet.DecodedRowGroup

    def counting(table):
        decoded.append(table.num_rows)
        return real(table)

    monkeypatch.setattr(dataloader.sources.parquet, "DecodedRowGroup", counting)
    source = ParquetDataSource(two_files, cache_row_groups=1)
    source.__getitems__([0, 14, 5, 1, 15, 6, 2])  # row groups 0, 4, 1, 0, 4, 1, 0
    assert len(decoded) == 3


def test_row_group_cache_stays_bounded_and_evicts_least_recently_used(two_files):
    source = ParquetDataSource(two_files, cache_row_groups=2)
    for i in range(16):
        source[i]
        assert len(source.cached_row_groups) <= 2
    source[0]  # group 0
    source[4]  # group 1
    source[1]  # group 0 again: now most recent
    source[8]  # group 2 evicts group 1
    assert source.cached_row_groups == (0, 2)


def test_pickled_source_reads_in_same_process(two_files):
    source = ParquetDataSource(two_files, columns=["id"])
    source[0]  # opens a file and fills the cache, neither of which is pickled
    clone = pickle.loads(pickle.dumps(source))
    assert clone.cached_row_groups == ()
    assert clone.__getitems__([11, 2]) == [{"id": 1001}, {"id": 2}]
    assert repr(clone) == repr(source)


@pytest.mark.multiprocess
@pytest.mark.timeout(300)  # spawned interpreters: seconds idle, far more on a loaded machine
def test_source_reads_in_spawned_process(two_files):
    source = ParquetDataSource(two_files, columns=["name"])
    source[0]
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        pid, rows = pool.apply_async(read_in_child, (source, [13, 3])).get(timeout=240)
    assert pid != os.getpid()
    assert rows == [{"name": "row1003"}, {"name": "row3"}]


def test_glob_reads_files_in_sorted_order(two_files, tmp_path):
    source = ParquetDataSource(str(tmp_path / "*.parquet"))
    assert source.paths == tuple(str(p) for p in two_files)


def test_repr_names_paths_columns_and_row_count(make_parquet):
    path = make_parquet("a.parquet", 3)
    assert repr(ParquetDataSource(path, columns=["id"])) == (
        f"ParquetDataSource(paths=[{str(path)!r}], columns=['id'], num_records=3)"
    )


def test_close_then_read_reopens(two_files):
    with ParquetDataSource(two_files) as source:
        source[0]
        source.close()
        assert source.cached_row_groups == ()
        assert source[1]["id"] == 1


def test_unknown_column_names_it_and_the_available_ones(two_files):
    with pytest.raises(
        ValueError, match=r"column 'nope' is not in Parquet file .*its columns are \['id', 'score'"
    ):
        ParquetDataSource(two_files, columns=["id", "nope"])


def test_column_missing_from_a_later_file_names_that_file(make_parquet, tmp_path):
    other = tmp_path / "other.parquet"
    pq.write_table(pa.table({"id": [1]}), other)
    with pytest.raises(
        ValueError, match=r"column 'score' is not in Parquet file '.*other\.parquet'"
    ):
        ParquetDataSource([make_parquet("a.parquet", 2), other])


def test_columns_as_a_bare_string_is_refused(two_files):
    with pytest.raises(
        TypeError,
        match=r"columns must be a list of column names, got str 'id'; for one column pass \['id'\]",
    ):
        ParquetDataSource(two_files, columns="id")


def test_duplicate_columns_are_refused(two_files):
    with pytest.raises(ValueError, match=r"columns lists \['id'\] more than once"):
        ParquetDataSource(two_files, columns=["id", "name", "id"])


def test_cache_row_groups_below_one_is_refused(two_files):
    with pytest.raises(ValueError, match="cache_row_groups must be at least 1, got 0"):
        ParquetDataSource(two_files, cache_row_groups=0)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"Parquet file '.*nope\.parquet' does not exist"):
        ParquetDataSource(tmp_path / "nope.parquet")


def test_glob_matching_nothing_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"glob pattern '.*\*\.parquet' matches no file"):
        ParquetDataSource(str(tmp_path / "*.parquet"))


def test_empty_path_list_is_refused():
    with pytest.raises(ValueError, match="paths is an empty tuple; pass at least one Parquet"):
        ParquetDataSource(())


def test_zero_byte_file_is_named(tmp_path):
    path = tmp_path / "empty.parquet"
    path.write_bytes(b"")
    with pytest.raises(ValueError, match=r"Parquet file '.*empty\.parquet' is empty \(0 bytes\)"):
        ParquetDataSource(path)


def test_file_without_rows_is_named(tmp_path):
    path = tmp_path / "zero.parquet"
    pq.write_table(parquet_table(0, 0), path)
    with pytest.raises(ValueError, match=r"Parquet file '.*zero\.parquet' has no rows"):
        ParquetDataSource(path)


def test_file_of_another_format_is_named(tmp_path):
    path = tmp_path / "text.parquet"
    path.write_bytes(b"not parquet at all\n" * 10)
    with pytest.raises(ValueError, match=r"'.*text\.parquet' is not a readable Parquet file"):
        ParquetDataSource(path)


def test_index_out_of_range_names_index_and_length(two_files):
    with pytest.raises(IndexError, match=r"index 16 is out of range for a source of length 16"):
        ParquetDataSource(two_files)[16]
