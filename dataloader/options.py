"""Options that say how a pipeline runs, never what it yields, and their checks.

``ReadOptions`` (in-process read-ahead) and ``MultiprocessingOptions`` (worker processes)
live together here, as Grain keeps them; none of their fields changes a single batch.
Both are frozen dataclasses that check every field at construction: change them with
``dataclasses.replace``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

# How long a worker may compute one unit before the loader logs it as stuck.
DEFAULT_STALL_WARNING_S = 60.0


def check_int(name: str, value: Any, low: int) -> int:
    """``value`` if it is an integer (not a bool) >= ``low``, else a ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


def check_bool(name: str, value: Any) -> bool:
    """``value`` if it is a bool, else a TypeError naming it (``"no"`` is not False)."""
    if not isinstance(value, bool):
        raise TypeError(
            f"{name} must be True or False, got {value!r} of type {type(value).__name__}"
        )
    return value


def check_seconds(name: str, value: Any) -> float | None:
    """``value`` as seconds if it is a positive finite number (not a bool), or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
        math.isfinite(value) and value > 0
    ):
        raise ValueError(f"{name} must be a positive number of seconds or None, got {value!r}")
    return float(value)


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


@dataclasses.dataclass(frozen=True)
class MultiprocessingOptions:
    """How many worker processes compute the stream, and how far ahead.

    Args:
        num_workers: child processes (0: compute in this process). The output is the
            same for every value.
        per_worker_buffer_size: work units (a batch each, usually) in flight per worker.

    Example:
        >>> MultiprocessingOptions(num_workers=2)
        MultiprocessingOptions(num_workers=2, per_worker_buffer_size=2)
    """

    num_workers: int = 0
    per_worker_buffer_size: int = 2

    def __post_init__(self) -> None:
        check_int("MultiprocessingOptions.num_workers", self.num_workers, 0)
        check_int("MultiprocessingOptions.per_worker_buffer_size", self.per_worker_buffer_size, 1)
