"""Functions run in child processes by the pickling tests (importable by spawn)."""

from __future__ import annotations

import os

from dataloader.sources import read_records


def read_in_child(source: object, indices: list[int]) -> tuple[int, list]:
    """Returns this process's pid and the records of ``indices``."""
    return os.getpid(), read_records(source, indices)


def reader_options_in_child(source: object, index: int) -> tuple[int, list[str], object]:
    """Returns this process's pid, the options strings with which ``source`` opened
    ArrayRecord readers here to read record ``index``, and that record."""
    from dataloader.sources import array_record

    opened: list[str] = []
    real = array_record.ArrayRecordReader

    def recording(path: str, options: str = "", **kwargs: object) -> object:
        opened.append(options)
        return real(path, options, **kwargs)

    array_record.ArrayRecordReader = recording  # type: ignore[assignment,misc]
    try:
        record = source[index]  # type: ignore[index]
    finally:
        array_record.ArrayRecordReader = real  # type: ignore[misc]
    return os.getpid(), opened, record
