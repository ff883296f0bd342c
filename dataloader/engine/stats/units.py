"""The engine's counters: what each work unit cost, gathered per unit (never per record).

:class:`Counted` sits between the executor and the assembler and hands every unit
result to :class:`Stats`, which adds its timings to the totals (see
:mod:`~dataloader.engine.stats.shape`) and keeps a bounded log of the latest units
(who computed each, when, and how long the consumer waited for it): the report draws
its timeline and queue depths from that log.

Cost per unit (``timeit`` on the 2-core VM): 1.5 microseconds to count it, 1.5 more for
this thread's CPU clock (read only with workers: a system call), next to the tenths of
a millisecond a unit costs this process to receive (``benchmarks/run.py`` measures the
parent's CPU per batch).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterator
from typing import Any, NamedTuple

from dataloader.engine.compute import UnitResult
from dataloader.engine.stats.filters import FilterWatch
from dataloader.engine.stats.shape import MAIN, empty_totals

LOG_UNITS = 4096  # units kept for timelines: a few seconds of a fast pipeline


class UnitRecord(NamedTuple):
    """One unit in the log (times are ``time.monotonic()`` seconds).

    Attributes:
        seq: the unit's number in this iterator's log (0, 1, ...).
        worker: ``"0"``, ``"1"``, ... or ``"main"`` (this process).
        began, ended: when the worker started and finished computing it.
        asked, got: when the consumer asked the executor for it and received it
            (``got - asked`` is how long the consumer waited for it).
        records: records the unit read.
        piped: its result came through a pipe instead of shared memory.
    """

    seq: int
    worker: str
    began: float
    ended: float
    asked: float
    got: float
    records: int
    piped: bool


class Stats:
    """The engine counters of one loader iterator (see the module docstring).

    ``seconds`` maps a stage (``"read"``, ``"batch"``, each operation's name,
    ``"transport"``) to the seconds spent on it in whichever process computed the unit;
    with workers these add up across processes, so they can exceed wall time. Work the
    consumer's process does itself (regrouping survivors into batches) is added to it
    too (the assembler writes into ``seconds``).
    """

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.seconds: dict[str, float] = {}
        self.units = 0
        self.records = 0
        self.elements = 0
        self.pipe_units = 0
        self.fetch_cpu_s = 0.0
        self.workers: dict[str, list[float]] = {}  # key -> [busy_s, cpu_s, units, first began]
        self.log: collections.deque[tuple[Any, ...]] = collections.deque(maxlen=LOG_UNITS)

    def add(self, result: UnitResult, asked: float, got: float, cpu: float) -> None:
        """Counts one unit the consumer received at ``got`` after asking at ``asked``."""
        records = result.stop - result.start
        self.records += records
        self.elements += result.elements if result.elements >= 0 else len(result.outputs)
        self.fetch_cpu_s += cpu
        seconds = self.seconds
        for stage, secs in result.timings.items():
            seconds[stage] = seconds.get(stage, 0.0) + secs
        key = str(result.worker) if result.worker >= 0 else MAIN
        entry = self.workers.get(key)
        if entry is None:
            entry = self.workers[key] = [0.0, 0.0, 0, result.began]
        entry[0] += result.ended - result.began
        entry[1] += result.cpu_s
        entry[2] += 1
        if result.piped:
            self.pipe_units += 1
        # A plain tuple (a UnitRecord's fields): building the named tuple costs more, and
        # only log_since, for reports, needs it.
        self.log.append((self.units, key, result.began, result.ended, asked, got, records, result.piped))
        self.units += 1

    def totals(self, now: float) -> dict[str, Any]:
        """The engine's part of the totals (``elements_out``, ``batches_out`` and
        ``wait_s`` are the iterator's to fill in)."""
        totals = empty_totals()
        totals.update(
            records_read=self.records, units=self.units, pipe_units=self.pipe_units,
            fetch_cpu_s=self.fetch_cpu_s, stage_seconds=dict(self.seconds),
        )
        totals["workers"] = {
            key: {"busy_s": busy, "cpu_s": cpu, "units": units, "span_s": max(0.0, now - first)}
            for key, (busy, cpu, units, first) in list(self.workers.items())
        }
        return totals

    def log_since(self, seq: int) -> list[UnitRecord]:
        """The logged units numbered ``seq`` or later (older ones may have left the log)."""
        log = list(self.log)
        if not log or log[-1][0] < seq:
            return []
        return [UnitRecord(*u) for u in log[max(0, len(log) - (log[-1][0] - seq + 1)):]]


class Counted:
    """Passes unit results through, timing each wait and counting each unit in ``stats``.

    With a :class:`FilterWatch`, also counts what the filters dropped in each unit (its
    positions without an output: the plan has filters and no flat map).

    ``cpu``: also measure this thread's CPU while it fetches units (``fetch_cpu_s``, what
    the ``parent_bound`` advice reads). Only worth it with workers: in this process the
    fetching is the computing, which the unit measures itself, and the clock costs a
    system call (about 0.7 microseconds) each time.
    """

    def __init__(
        self, units: Iterator[UnitResult], stats: Stats, watch: FilterWatch | None = None, cpu: bool = True
    ) -> None:
        self._units = units
        self._stats = stats
        self._watch = watch
        self._cpu = cpu
        self._error: BaseException | None = None

    def __iter__(self) -> Counted:
        return self

    def __next__(self) -> UnitResult:
        error = self._error
        if error is not None:  # the unit before was cut at its failing record
            self._error = None
            raise error
        if not self._cpu:
            asked = time.monotonic()
            result = next(self._units)
            self._stats.add(result, asked, time.monotonic(), result.cpu_s)
        else:
            asked, cpu = time.monotonic(), time.thread_time()
            result = next(self._units)
            self._stats.add(result, asked, time.monotonic(), time.thread_time() - cpu)
        if self._watch is not None:
            self._watch.add_unit(result.start, result.stop, result.tags()[0])
        if result.error is not None:
            self._error, result.error = result.error, None
        return result
