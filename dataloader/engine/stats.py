"""Where the time went: per-stage seconds, gathered per unit (never per record)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from dataloader.engine.compute import UnitResult


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


class Counted:
    """Passes unit results through, timing each wait and adding up their timings."""

    def __init__(self, units: Iterator[UnitResult], stats: Stats) -> None:
        self._units = units
        self._stats = stats

    def __iter__(self) -> Counted:
        return self

    def __next__(self) -> UnitResult:
        began = time.perf_counter()
        result = next(self._units)
        self._stats.add(result, time.perf_counter() - began)
        return result
