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
  every thread computes. A unit's CPU share (its thread's CPU time over the part of its
  wall time the thread was not runnable-and-waiting for a CPU: ``/proc/thread-self/
  schedstat``'s run delay is taken out) alone, against beside the others, estimates the
  share of a unit's time that holds the GIL: a thread waiting for the GIL sleeps on a
  condition, so with ``n`` threads a share ``h`` lowers the CPU share by about
  ``1 + h * (n - 1)``. Waiting on I/O lowers both alike. Past :data:`GIL_LIMIT` the
  pool hands over to processes (the threads first answer what they hold), else it keeps
  its threads. The choice is logged and shown in ``stats()["pipeline"]["workers"]``; it
  never changes the output (a unit is the same whoever computes it).

On a loaded machine the threads' clocks cannot tell a GIL wait from a wait for a CPU.
In the loader on the 2-core VM, a pure-Python unit beside another thread spent its time
off the CPU runnable, almost never asleep on the GIL (a woken GIL waiter then waits for a
CPU), so with the run delay taken out the share read 0 to 7%, at a load of 4 as at 8;
without it, load alone reads as a held GIL. So the share is read both ways and the
larger decides: threads stay only where they visibly ran side by side, and a doubt goes
to processes, the default, which scale whatever the units do (at worst a pipeline that
releases the GIL gets processes on a busy machine, and their memory). A round where the
threads waited for a CPU more than :data:`BUSY_LIMIT` of the time is measured again, and
after :data:`ATTEMPTS` such rounds the pool takes processes (an earlier rule kept the
threads there, and chose threads for pure Python on every loaded run). The shares are
read from sums over a round's units, each unit timed between two readings of
:func:`clocks`, so that its wait for a CPU and its wall time cover the same span.
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from dataloader.engine.plan import Plan

logger = logging.getLogger("dataloader")

KINDS = ("processes", "threads", "auto")
# Past this share of a unit's time holding the GIL, 2 threads reach less than about 0.75x
# of what 2 processes do (1 / (1 + h) of 2x): processes win despite their pickling.
GIL_LIMIT = 0.35
SOLO_UNITS = 4  # units the first thread computes alone (the first warms it up)
PAIR_UNITS_PER_THREAD = 4  # units per thread measured while all compute
BUSY_LIMIT = 0.5  # past this share of wall time waiting for a CPU, a round tells nothing
ATTEMPTS = 3  # rounds measured before a too busy machine gets processes


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


def clocks() -> tuple[float, float, float]:
    """This thread's (``time.monotonic``, CPU seconds, seconds waited for a CPU), read
    together: a trial unit is timed between two of them, so that its wall time and its
    wait for a CPU cover the same span (a wait outside the wall time read as more wait
    than wall on a loaded machine)."""
    return time.monotonic(), time.thread_time(), run_delay_s()


class KindTrial:
    """The measurement behind ``worker_kind="auto"`` (see the module docstring). Fed by
    the worker threads (:meth:`record`), read by the pool; every field under one lock."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self._lock = threading.Lock()
        self._counts = [0] * threads  # units each thread has recorded
        # Sums over units: [CPU seconds, seconds not waiting for a CPU, units, wall
        # seconds], alone and beside the others; and the seconds waited for a CPU and of
        # wall beside them.
        self._alone = [0.0, 0.0, 0, 0.0]
        self._beside = [0.0, 0.0, 0, 0.0]
        self._busy = [0.0, 0.0]
        self._solo: float | None = None  # a unit's CPU share, alone
        self._warm_at: float | None = None  # every thread has computed a unit since
        self._first_ends: dict[int, float] = {}
        self.rounds = 0  # rounds thrown away: the machine was too busy
        self.why = "measuring (threads meanwhile)"
        self.gil_share: float | None = None
        self.verdict: str | None = None  # "threads" or "processes" once decided

    @property
    def solo_done(self) -> bool:
        with self._lock:
            return self._solo is not None

    def record(self, index: int, before: tuple[float, float, float], after: tuple[float, float, float]) -> None:
        """Thread ``index`` computed a unit between two readings of :func:`clocks`."""
        self.add(index, before[0], after[0], after[1] - before[1], after[2] - before[2])

    def add(self, index: int, began: float, ended: float, cpu: float, waited: float = 0.0) -> None:
        """Thread ``index`` computed a unit from ``began`` to ``ended``
        (``time.monotonic``), using ``cpu`` seconds of CPU, ``waited`` of it runnable
        but waiting for a CPU."""
        running = max(ended - began - waited, 0.0)
        with self._lock:
            if self.verdict is not None or index >= self.threads:
                return
            self._counts[index] += 1
            if self._solo is None:
                if index == 0 and self._counts[0] > 1:  # the first warmed up
                    _add(self._alone, cpu, running, ended - began)
                if self._alone[2] >= SOLO_UNITS - 1:
                    self._solo = _share(self._alone)
                return
            self._first_ends.setdefault(index, ended)
            if self._warm_at is None:
                if len(self._first_ends) >= self.threads:
                    self._warm_at = max(self._first_ends.values())
                return
            if began >= self._warm_at:
                _add(self._beside, cpu, running, ended - began)
                self._busy[0] += waited
                self._busy[1] += ended - began
            if self._beside[2] >= PAIR_UNITS_PER_THREAD * self.threads:
                self._decide(ended)

    def _decide(self, now: float) -> None:
        assert self._solo is not None
        busy = self._busy[0] / max(self._busy[1], 1e-9)
        if busy > BUSY_LIMIT:
            self.rounds += 1
            if self.rounds < ATTEMPTS:  # measure again, on units that start from now
                self._beside, self._busy, self._warm_at = [0.0, 0.0, 0, 0.0], [0.0, 0.0], now
                return
            self.verdict = "processes"
            self.why = (
                f"the machine was too busy to measure (the threads waited for a CPU "
                f"{busy:.0%} of the time, {ATTEMPTS} rounds): processes, which scale "
                f"whatever the units do"
            )
            logger.info("granary: worker_kind auto: %s", self.why)
            return
        pair = _share(self._beside)
        # Read twice: with the waits for a CPU taken out (a busy machine is no GIL), and
        # as they are (a GIL wait that became a wait for a CPU is still seen); the larger
        # decides, so threads stay only where they visibly ran side by side.
        shares = (self._solo / pair, _share(self._alone, raw=True) / _share(self._beside, raw=True))
        share = (max(shares) - 1.0) / max(1, self.threads - 1)
        self.gil_share = min(1.0, max(0.0, share))
        self.verdict = "processes" if self.gil_share > GIL_LIMIT else "threads"
        self.why = "measured on the first units"
        logger.info(
            "granary: worker_kind auto: a unit holds the GIL about %.0f%% of its time "
            "(CPU %.0f%% of its running time alone, %.0f%% beside %d threads; they waited "
            "for a CPU %.0f%% of the time): %s",
            100 * self.gil_share, 100 * self._solo, 100 * pair, self.threads - 1, 100 * busy, self.verdict,
        )

    def describe(self) -> dict[str, Any]:
        with self._lock:
            return {
                "worker_kind": self.verdict or "threads",
                "why": self.why,
                "gil_share": self.gil_share,
            }


def _add(sums: list, cpu: float, running: float, wall: float) -> None:
    sums[0] += cpu
    sums[1] += running
    sums[2] += 1
    sums[3] += wall


def _share(sums: list, raw: bool = False) -> float:
    """CPU seconds over the seconds not spent waiting for a CPU (``raw``: over the wall
    seconds), at most 1 (the clocks are read apart)."""
    return max(min(1.0, sums[0] / max(sums[3 if raw else 1], sums[0], 1e-9)), 1e-6)


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
