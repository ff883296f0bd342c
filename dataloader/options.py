"""Loader options that are not part of the pipeline's meaning."""

from __future__ import annotations

import dataclasses


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
        for name, low in (("num_threads", 0), ("prefetch_buffer_size", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"ReadOptions.{name} must be an integer >= {low}, got {value!r}")
        if self.unit_size is not None and (
            isinstance(self.unit_size, bool) or not isinstance(self.unit_size, int) or self.unit_size < 1
        ):
            raise ValueError(
                f"ReadOptions.unit_size must be a positive integer or None, got {self.unit_size!r}"
            )
