"""Stuck work: which worker has been on which unit, in which operation, for too long.

The error for a unit that keeps killing its worker is written here too
(:func:`crash_error`): like a timeout, it names the unit by its record indices.

While the consumer waits, the pool asks :meth:`StallWatch.check` every
:attr:`~StallWatch.interval` seconds. It compares each worker's progress slot
(:mod:`~dataloader.engine.pool.watch.progress`) with the unit the scheduling window says the
worker computes (its oldest unit: a worker computes its units in order):

* past ``stall_warning_s`` the loader logs a warning, once per unit, on the
  ``"dataloader"`` logger, naming the worker, the unit, its record indices and the
  operation it is in;
* past ``unit_timeout_s`` the unit becomes a
  :class:`~dataloader.errors.WorkerTimeoutError` at its place in the stream, and the
  pool kills and replaces the worker. The unit is not computed again: a unit that hangs
  once would most likely hang again, and silently retrying would hide it.

A unit the parent computes itself (a warm-start unit, or every unit with
``worker_count=0``) runs in the training thread and is not watched; with
``unit_timeout_s`` set, the pool therefore computes every unit in a worker.
"""

from __future__ import annotations

import logging
import time
from typing import Any, NamedTuple

from dataloader.engine.compute import stage_names, unit_record_keys
from dataloader.engine.plan import Plan
from dataloader.engine.pool.watch.progress import ELSEWHERE, IDLE, SENDING
from dataloader.engine.pool.window import Window
from dataloader.engine.pool.workers import Workers
from dataloader.errors import WorkerCrashError, WorkerTimeoutError

logger = logging.getLogger("dataloader")
_SHOWN = 16  # record indices written out in a message


class Stuck(NamedTuple):
    """A worker past ``unit_timeout_s``; ``error`` is None for a unit of an old stream
    (nobody waits for it, but the units queued behind it do)."""

    worker: Any
    error: WorkerTimeoutError | None


class StallWatch:
    """Checks the workers of one pool against the two thresholds (either may be None)."""

    def __init__(self, plan: Plan, warning_s: float | None, timeout_s: float | None) -> None:
        self._plan = plan
        self._names = stage_names(plan)
        self.warning_s = warning_s
        self.timeout_s = timeout_s
        limits = [s for s in (warning_s, timeout_s) if s is not None]
        # How often the waiting consumer looks: often enough to act within a fraction
        # of the smallest threshold, and to notice close() from another thread quickly.
        self.interval = min([0.25, *(s / 4 for s in limits)])
        self._warned: set[tuple[int, int]] = set()

    def _operation(self, stage: int) -> str:
        if stage == SENDING:
            return "sending the result"
        if stage == ELSEWHERE:
            return "an operation it does not report"
        return self._names[stage] if 0 <= stage < len(self._names) else f"stage {stage}"

    def _unit_text(self, window: Window, generation: int, unit: int) -> tuple[str, list[int], int]:
        """How a message names a unit, its record indices and its first position."""
        if generation != window.generation:
            return f"unit {unit} of an earlier stream (before a set_state)", [], -1
        start, stop = window.range(unit)
        keys = unit_record_keys(self._plan, start, stop).tolist()
        listed = ", ".join(map(str, keys[:_SHOWN]))
        if len(keys) > _SHOWN:
            listed += f", ... ({len(keys)} records)"
        return f"unit {unit} (positions [{start}, {stop}), record indices [{listed}])", keys, start

    def check(self, workers: Workers, window: Window) -> list[Stuck]:
        """Logs the new stalls; returns the workers past ``unit_timeout_s``.

        A unit's time counts from when its worker started it (its slot on the board),
        never from when it was sent: a unit waiting behind another, or an answer not
        taken in while the consumer is away, is not stuck."""
        now = time.monotonic_ns()
        stuck = []
        board = workers.board
        for w in workers.workers:
            entry = window.current(w.key) if w.ready else None
            if entry is None:
                continue
            slot = board.read(w.index)
            if (slot.generation, slot.unit) != (entry.generation, entry.unit) or slot.stage == IDLE:
                continue  # not started on it yet, or done with it (the answer is in the pipe)
            seconds = (now - slot.started_ns) / 1e9
            timed_out = self.timeout_s is not None and seconds >= self.timeout_s
            if not timed_out and (
                self.warning_s is None
                or seconds < self.warning_s
                or (entry.generation, entry.unit) in self._warned
            ):
                continue
            what, keys, start = self._unit_text(window, entry.generation, entry.unit)
            operation = self._operation(slot.stage)
            where = f"worker {w.index} ({w.where}) has been computing {what} for {seconds:.1f} s; it is in {operation}"
            if not timed_out:
                self._warned.add((entry.generation, entry.unit))
                then = (
                    "set unit_timeout_s to make it an error"
                    if self.timeout_s is None
                    else f"it becomes an error at unit_timeout_s={self.timeout_s:g} s"
                )
                logger.warning(
                    "%s. A unit this slow is usually stuck (a lock, a read without a timeout, "
                    "an endless loop); %s, or raise stall_warning_s (now %g s) if units are "
                    "this slow.",
                    where,
                    then,
                    self.warning_s,
                )
                continue
            error = None
            if start >= 0:
                error = WorkerTimeoutError(
                    f"{where}, past unit_timeout_s={self.timeout_s:g}; {workers.stop_words}, "
                    f"and the unit is not computed again. Find what blocks "
                    f"(run these records with worker_count=0), or raise unit_timeout_s",
                    operation=operation,
                    record_indices=keys,
                    position=start,
                    worker=w.index,
                )
            logger.warning("%s; %s (unit_timeout_s=%g s)", where, workers.stop_verb, self.timeout_s)
            stuck.append(Stuck(w, error))
        return stuck


def crash_error(
    plan: Plan, positions: tuple[int, int], code: int, crashes: int, oom: str | None = None
) -> WorkerCrashError:
    """The error at the place of a unit (``positions``) that killed its worker ``crashes``
    times, the last time with exit code ``code`` (negative: a signal); ``oom``: the
    OOM killer took the worker the last time, in these words
    (:mod:`~dataloader.engine.pool.autoscale.oom`), so no record is blamed."""
    start, stop = positions
    keys = unit_record_keys(plan, start, stop).tolist()
    if oom is not None:
        return WorkerCrashError(
            f"the unit of positions [{start}, {stop}) (record indices {keys}) was lost with "
            f"its worker {crashes} times, the last time for memory: {oom}"
        )
    how = f"signal {-code}" if code < 0 else f"exit code {code}"
    return WorkerCrashError(
        f"the unit of positions [{start}, {stop}) killed its worker {crashes} times "
        f"(last: {how}); it reads record indices {keys}; find the record that crashes "
        f"(e.g. with worker_count=0 under a debugger) and filter or repair it"
    )
