"""Tests for the data-source protocol and read_records."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from dataloader.sources import (
    InMemoryDataSource,
    RandomAccessDataSource,
    RangeDataSource,
    read_records,
)


class _GetItemOnly:
    """A source with only the two protocol methods."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.calls: list[object] = []

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        self.calls.append(index)
        return index * 10


class _BatchedSource(_GetItemOnly):
    def __init__(self, n: int, short: bool = False) -> None:
        super().__init__(n)
        self.short = short
        self.batches: list[object] = []

    def __getitems__(self, indices):
        self.batches.append(indices)
        values = [int(i) * 100 for i in indices]
        return tuple(values[:-1] if self.short else values)


@pytest.mark.parametrize(
    "source",
    [[1, 2], np.arange(3), RangeDataSource(3), InMemoryDataSource([1]), _GetItemOnly(2)],
    ids=["list", "ndarray", "range", "in_memory", "user_class"],
)
def test_objects_with_len_and_getitem_satisfy_protocol(source):
    assert isinstance(source, RandomAccessDataSource)


@pytest.mark.parametrize("obj", [iter([1]), 3, {1, 2}], ids=["iterator", "int", "set"])
def test_objects_without_getitem_or_len_do_not_satisfy_protocol(obj):
    assert not isinstance(obj, RandomAccessDataSource)


def test_read_records_uses_getitem_without_getitems():
    source = _GetItemOnly(5)
    assert read_records(source, [3, 0, 3]) == [30, 0, 30]
    assert source.calls == [3, 0, 3]


def test_read_records_passes_python_ints_from_numpy_array_to_getitem():
    source = _GetItemOnly(5)
    read_records(source, np.array([4, 1], dtype=np.int64))
    assert all(type(i) is int for i in source.calls)


def test_read_records_uses_getitems_once_and_returns_list():
    source = _BatchedSource(5)
    indices = np.array([2, 2, 0], dtype=np.int64)
    assert read_records(source, indices) == [200, 200, 0]
    assert len(source.batches) == 1
    assert source.batches[0] is indices
    assert source.calls == []


def test_read_records_rejects_getitems_returning_wrong_count():
    with pytest.raises(ValueError, match=r"returned 2 records for 3 indices"):
        read_records(_BatchedSource(5, short=True), [0, 1, 2])


def test_read_records_rejects_float_index_without_getitems():
    with pytest.raises(TypeError, match="float"):
        read_records(_GetItemOnly(5), [1.5])


def _modules_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(' '.join(sorted(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return {".".join(name.split(".")[:2]) for name in result.stdout.split()}


def test_importing_sources_pulls_in_no_other_granary_package():
    loaded = _modules_after("import dataloader.sources")
    assert "dataloader.sources" in loaded
    others = {"dataloader.samplers", "dataloader.operations", "dataloader.engine", "dataloader.dataset"}
    assert not others & loaded


def test_importing_sources_defers_pyarrow_until_parquet_is_used():
    assert "pyarrow" not in _modules_after("import dataloader.sources")
    assert "pyarrow" in _modules_after("from dataloader.sources import ParquetDataSource")
