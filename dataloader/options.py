"""Loader options that are not part of the pipeline's meaning."""

from __future__ import annotations

import dataclasses
from typing import Any


def check_int(name: str, value: Any, low: int) -> int:
    """``value`` if it is an integer (not a bool) >= ``low``, else a ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class ReadOptions:
    """How the in-process path reads ahead; none of it changes the output.

    Args:
        num_threads: with ``worker_count=0``, threads that compute work units ahead of
            the consumer (0: compute in the caller's thread). Useful when reads wait on
            I/O; the GIL makes it useless for CPU-bound operations, which want workers.
        prefetch_buffer_size: work units computed ahead by those threads.
        unit_size: positions per work unit when a filter or flat map precedes the batch
            or there is no batch (default: the batch size, else 128). With a plain batch
            a unit is always exactly one batch.

    Example:
        >>> ReadOptions(num_threads=2, prefetch_buffer_size=4)
        ReadOptions(num_threads=2, prefetch_buffer_size=4, unit_size=None)
    """

    num_threads: int = 0
    prefetch_buffer_size: int = 2
    unit_size: int | None = None

    def __post_init__(self) -> None:
        check_int("ReadOptions.num_threads", self.num_threads, 0)
        check_int("ReadOptions.prefetch_buffer_size", self.prefetch_buffer_size, 1)
        if self.unit_size is not None:
            check_int("ReadOptions.unit_size", self.unit_size, 1)
