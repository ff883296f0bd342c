"""Which kind of worker computes the units: processes, threads, or chosen by measurement.

``worker_kind="threads"`` pays no pickling, no result copy and no interpreter per
worker; it scales only where the units release the GIL (decoders, zlib, numpy, Rust
tokenizers, Arrow). ``"processes"`` scales whatever the units do. ``"auto"`` measures:

* on an interpreter without a GIL (free-threaded CPython, ``sys._is_gil_enabled()``
  false) threads are chosen at once;
* with one worker, processes (a single worker thread would share the GIL with the
  training loop itself, and there is no second thread to measure against);
* else the pool starts with threads and runs a short trial on the stream's first units
  (:class:`KindTrial`), which are kept: one thread computes its first units alone, then
  every thread computes. A unit's CPU share (its thread's CPU time over its wall time
  less the time the thread waited, runnable, for a CPU: ``/proc/thread-self/schedstat``,
  so a busy machine does not read as a held GIL) alone, against beside the others,
  estimates the share of a unit's time that holds the GIL: a thread waiting for the GIL
  sleeps, so with ``n`` threads a share ``h`` lowers the CPU share by about
  ``1 + h * (n - 1)``. Waiting on I/O lowers both alike. On a machine so busy that the
  threads wait for a CPU more than half the time (:data:`BUSY_LIMIT`), a thread waiting
  for the GIL is mostly runnable too and the share cannot be read: the trial measures
  again on later units, and after :data:`ATTEMPTS` such rounds keeps the threads (the
  cheaper kind), saying so. Past :data:`GIL_LIMIT` the pool hands over to processes (the threads
  first answer what they hold), else it keeps its threads. The choice is logged and shown
  in ``stats()["pipeline"]["workers"]``; it never changes the output (a unit is the
  same whoever computes it).
"""

from __future__ import annotations

import functools
import logging
import statistics
import sys
import threading
from collections.abc import Callable
from typing import Any

from dataloader.engine.plan import Plan

logger = logging.getLogger("dataloader")

KINDS = ("processes", "threads", "auto")
# Past this share of a unit's time holding the GIL, 2 threads reach less than about 0.75x
# of what 2 processes do (1 / (1 + h) of 2x): processes win despite their pickling.
GIL_LIMIT = 0.35
SOLO_UNITS = 4  # units the first thread computes alone (the first warms it up)
PAIR_UNITS_PER_THREAD = 3  # units per thread measured while all compute
BUSY_LIMIT = 0.5  # past this share of wall time waiting for a CPU, a round tells nothing
ATTEMPTS = 3  # rounds measured before a too busy machine keeps the threads


def gil_enabled() -> bool:
    """False on a free-threaded interpreter that runs without its GIL."""
    if sys.version_info < (3, 13):
        return True
    return bool(sys._is_gil_enabled())


def run_delay_s() -> float:
    """Seconds this thread has waited, runnable, for a CPU; 0 where the kernel does not
    say (no ``schedstat``)."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


class KindTrial:
    """The measurement behind ``worker_kind="auto"`` (see the module docstring). Fed by
    the worker threads (:meth:`record`), read by the pool; every field under one lock."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self._lock = threading.Lock()
        self._counts = [0] * threads  # units each thread has recorded
        self._solo_rates: list[float] = []
        self._solo: float | None = None  # a unit's CPU share, alone
        self._warm_at: float | None = None  # every thread has computed a unit since
        self._first_ends: dict[int, float] = {}
        self._pair: list[float] = []
        self._busy = [0.0, 0.0]  # this round's seconds waiting for a CPU, and of wall
        self.rounds = 0  # rounds thrown away: the machine was too busy
        self.why = "measuring (threads meanwhile)"
        self.gil_share: float | None = None
        self.verdict: str | None = None  # "threads" or "processes" once decided

    @property
    def solo_done(self) -> bool:
        with self._lock:
            return self._solo is not None

    def record(self, index: int, began: float, ended: float, cpu: float, waited: float = 0.0) -> None:
        """Thread ``index`` computed a unit from ``began`` to ``ended``
        (``time.monotonic``), using ``cpu`` seconds of CPU, ``waited`` of it runnable
        but waiting for a CPU."""
        rate = min(1.0, cpu / max(ended - began - waited, cpu, 1e-9))
        with self._lock:
            if self.verdict is not None or index >= self.threads:
                return
            self._counts[index] += 1
            if self._solo is None:
                if index == 0 and self._counts[0] > 1:  # the first warmed up
                    self._solo_rates.append(rate)
                if len(self._solo_rates) >= SOLO_UNITS - 1:
                    self._solo = max(statistics.median(self._solo_rates), 1e-6)
                return
            self._first_ends.setdefault(index, ended)
            if self._warm_at is None:
                if len(self._first_ends) >= self.threads:
                    self._warm_at = max(self._first_ends.values())
                return
            if began >= self._warm_at:
                self._pair.append(rate)
                self._busy[0] += waited
                self._busy[1] += ended - began
            if len(self._pair) >= PAIR_UNITS_PER_THREAD * self.threads:
                self._decide(ended)

    def _decide(self, now: float) -> None:
        assert self._solo is not None
        busy = self._busy[0] / max(self._busy[1], 1e-9)
        if busy > BUSY_LIMIT:
            self.rounds += 1
            if self.rounds < ATTEMPTS:  # measure again, on units that start from now
                self._pair, self._busy, self._warm_at = [], [0.0, 0.0], now
                return
            self.verdict = "threads"
            self.why = (
                f"the machine was too busy to measure (the threads waited for a CPU "
                f"{busy:.0%} of the time, {ATTEMPTS} rounds): threads kept"
            )
            logger.info("granary: worker_kind auto: %s", self.why)
            return
        pair = max(statistics.median(self._pair), 1e-6)
        share = (self._solo / pair - 1.0) / max(1, self.threads - 1)
        self.gil_share = min(1.0, max(0.0, share))
        self.verdict = "processes" if self.gil_share > GIL_LIMIT else "threads"
        self.why = "measured on the first units"
        logger.info(
            "granary: worker_kind auto: a unit holds the GIL about %.0f%% of its time "
            "(CPU %.0f%% of its wall time alone, %.0f%% beside %d threads): %s",
            100 * self.gil_share, 100 * self._solo, 100 * pair, self.threads - 1, self.verdict,
        )

    def describe(self) -> dict[str, Any]:
        with self._lock:
            return {
                "worker_kind": self.verdict or "threads",
                "why": self.why,
                "gil_share": self.gil_share,
            }


def choose_at_start(kind: str, workers: int, gil: bool) -> tuple[str | None, str]:
    """The kind ``kind`` resolves to before any unit runs (None: measure, a trial), and
    why, in words for ``stats()``."""
    if kind != "auto":
        return kind, "asked for"
    if not gil:
        return "threads", "the interpreter runs without a GIL"
    if workers <= 1:
        return "processes", "one worker: a thread would share the GIL with the training loop"
    return None, "measured on the first units"


def worker_sets(kind: str, plan: Plan, plan_bytes: bytes, init_fn: Any, workers: int) -> Callable[[int], Any]:
    """``f(slots)`` making the worker set of ``kind`` (``"auto"``: see the module)."""
    from dataloader.engine.pool.pickling import dumps_checked
    from dataloader.engine.pool.process_set import ProcessSet
    from dataloader.engine.pool.thread_set import ThreadSet

    chosen, why = choose_at_start(kind, workers, gil_enabled())
    # Threads share worker_init_fn as it is; processes (and a trial that may hand over to
    # them) get it pickled, checked here to unpickle (it fails now, naming the object).
    init_bytes = b"" if chosen == "threads" else dumps_checked(init_fn, "worker_init_fn")
    processes = functools.partial(ProcessSet, plan_bytes=plan_bytes, init_fn=init_bytes)
    if chosen == "processes":
        return functools.partial(processes, why=why)
    if chosen == "threads":
        return functools.partial(ThreadSet, plan=plan, init_fn=init_fn, why=why)

    def trial(slots: int) -> Any:
        return ThreadSet(slots, plan, init_fn, trial=KindTrial(workers), then=processes)

    return trial
