"""Fixtures that write small data files for the source tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from dataloader.sources import write_array_record
from tests.sources._data import parquet_table, record


@pytest.fixture
def make_array_record(tmp_path: Path) -> Callable[..., Path]:
    """Returns ``make(name, count, file_number=0, group_size=1) -> path``."""

    def make(name: str, count: int, file_number: int = 0, group_size: int = 1) -> Path:
        path = tmp_path / name
        records = [record(file_number, i) for i in range(count)]
        write_array_record(path, records, group_size=group_size)
        return path

    return make


@pytest.fixture
def make_parquet(tmp_path: Path) -> Callable[..., Path]:
    """Returns ``make(name, num_rows, file_number=0, row_group_size=4) -> path``."""

    def make(name: str, num_rows: int, file_number: int = 0, row_group_size: int = 4) -> Path:
        path = tmp_path / name
        pq.write_table(parquet_table(file_number, num_rows), path, row_group_size=row_group_size)
        return path

    return make
