"""Functions run in child processes by the pickling tests (importable by spawn)."""

from __future__ import annotations

import os

from dataloader.sources import read_records


def read_in_child(source: object, indices: list[int]) -> tuple[int, list]:
    """Returns this process's pid and the records of ``indices``."""
    return os.getpid(), read_records(source, indices)
