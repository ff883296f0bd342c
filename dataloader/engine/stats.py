"""Where the time went: per-stage seconds, gathered per unit (never per record)."""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

from dataloader.engine.compute import UnitResult
from dataloader.operations import FilterTransform, FlatMapTransform


class Stats:
    """Counters of one iterator.

    ``seconds`` maps a stage (``"read"``, ``"batch"``, each operation's name) to the
    seconds spent on it in whichever process computed the unit; with workers these
    add up across processes, so they can exceed wall time. ``wait_s`` is the time
    the consumer spent waiting for the next unit: with workers, time blocked on them;
    in-process, the computing itself.
    """

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.seconds: dict[str, float] = {}
        self.units = 0
        self.positions = 0
        self.wait_s = 0.0

    def add(self, result: UnitResult, waited: float) -> None:
        self.units += 1
        self.positions += result.stop - result.start
        self.wait_s += waited
        for stage, secs in result.timings.items():
            self.seconds[stage] = self.seconds.get(stage, 0.0) + secs

    def as_dict(self) -> dict[str, Any]:
        return {
            "elapsed_s": time.perf_counter() - self.started,
            "units": self.units,
            "records_read": self.positions,
            "wait_s": self.wait_s,
            "stage_seconds": dict(self.seconds),
        }


def sorted_stages(stats: dict[str, Any]) -> list[tuple[str, float]]:
    """The ``(stage, seconds)`` pairs of an iterator's ``stats()``, most time first.

    Example:
        >>> sorted_stages({"stage_seconds": {"read": 0.5, "batch": 1.5}})
        [('batch', 1.5), ('read', 0.5)]
    """
    return sorted(stats["stage_seconds"].items(), key=lambda kv: -kv[1])


class FilterWatch:
    """Grain's filter thresholds: the share of records the filters dropped, checked on
    consecutive windows of at least ``WINDOW`` records read.

    Args:
        warn, fail: ratios above which to warn (once per window) or raise; None: never.
        where: names the pipeline's filters in the messages.
    """

    WINDOW = 1000

    def __init__(self, warn: float | None, fail: float | None, where: str) -> None:
        self._warn, self._fail, self._where = warn, fail, where
        self._read = self._dropped = 0

    @classmethod
    def for_operations(cls, ops: Sequence[Any], options: Any) -> FilterWatch | None:
        """A watch over ``ops`` with ``options`` (a ``DatasetOptions``), or None: no filter,
        no threshold, or a flat map (which adds elements, so drops cannot be counted)."""
        filters = [op.name for op in ops if isinstance(op, FilterTransform)]
        if not filters or any(isinstance(op, FlatMapTransform) for op in ops):
            return None
        warn = options.get("filter_warn_threshold_ratio")
        fail = options.get("filter_raise_threshold_ratio")
        if warn is None and fail is None:
            return None
        return cls(warn, fail, ", ".join(filters))

    def add(self, read: int, dropped: int) -> None:
        self._read += read
        self._dropped += dropped
        if self._read < self.WINDOW:
            return
        ratio, read = self._dropped / self._read, self._read
        self._read = self._dropped = 0
        if self._fail is not None and ratio > self._fail:
            raise ValueError(
                f"the filters {self._where} dropped {ratio:.1%} of the last {read} records, "
                f"above filter_raise_threshold_ratio={self._fail}; check the filters or raise "
                f"the threshold (DatasetOptions)"
            )
        if self._warn is not None and ratio > self._warn:
            warnings.warn(
                f"granary: the filters {self._where} dropped {ratio:.1%} of the last {read} "
                f"records (above filter_warn_threshold_ratio={self._warn}; DatasetOptions sets it)",
                UserWarning,
                stacklevel=2,
            )


class Counted:
    """Passes unit results through, timing each wait and adding up their timings.

    With a :class:`FilterWatch`, also counts what the filters dropped in each unit (the
    unit's records minus its outputs: the plan has filters and no flat map).
    """

    def __init__(self, units: Iterator[UnitResult], stats: Stats, watch: FilterWatch | None = None) -> None:
        self._units = units
        self._stats = stats
        self._watch = watch

    def __iter__(self) -> Counted:
        return self

    def __next__(self) -> UnitResult:
        began = time.perf_counter()
        result = next(self._units)
        self._stats.add(result, time.perf_counter() - began)
        if self._watch is not None:
            read = result.stop - result.start
            self._watch.add(read, read - len(result.outputs))
        return result
