"""Deterministic records and tables that the source tests write and expect."""

from __future__ import annotations

import pyarrow as pa


def record(file_number: int, i: int) -> bytes:
    """The record written at position ``i`` of file ``file_number``."""
    return f"file{file_number}-record{i}".encode()


def parquet_table(file_number: int, num_rows: int) -> pa.Table:
    """A table with one column of each value type the Parquet source maps."""
    base = file_number * 1000
    return pa.table(
        {
            "id": pa.array([base + i for i in range(num_rows)], pa.int64()),
            "score": pa.array([i / 4 for i in range(num_rows)], pa.float32()),
            "flag": pa.array([i % 2 == 0 for i in range(num_rows)], pa.bool_()),
            "name": pa.array([f"row{base + i}" for i in range(num_rows)], pa.string()),
            "blob": pa.array([bytes([i % 256]) * 3 for i in range(num_rows)], pa.binary()),
            "tokens": pa.array([list(range(i % 4)) for i in range(num_rows)], pa.list_(pa.int32())),
            "maybe": pa.array([None if i % 3 == 0 else i for i in range(num_rows)], pa.int16()),
        }
    )
