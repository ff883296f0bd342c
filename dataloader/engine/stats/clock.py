"""Per-iterator clocks: time in ``next()``, a rolling window, and periodic hooks.

Every iterator (the loader's, each iterator-level stage, the device feed) owns one
:class:`Clock`, and its ``__next__`` runs through :meth:`Clock.call`, which counts

* ``outputs``: the elements it handed out;
* the seconds callers spent inside its ``next()``: the first call apart (``first_s``,
  start-up: workers starting, the first unit), then the others (:meth:`wait_s`).

Timing every call costs two clock reads and some bookkeeping, about 0.6 microseconds,
which is nothing next to a batch but too much for a stream of small elements going
through several stages (a Parquet row costs a few microseconds). So a clock times
every call at first, and once it has seen 64 calls averaging under ``CHEAP_S`` it
times one call in ``SAMPLE_EVERY`` and scales up (an unbiased estimate; an untimed call
costs a counter and a test). A stage's own time, in ``stats()``, is its time in
``next()`` minus that of its parents called from the same thread (see
:mod:`~dataloader.engine.stats.collect`): a stage whose parent runs in a prefetch
thread is charged only for what ran on its own thread.

On timed calls, at most once a second, the clock also takes a snapshot of the
iterator's totals (:class:`History`), from which ``stats()["window"]`` is the
difference, and runs the hooks that are due (``add_stats_hook``).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from typing import Any

WINDOW_S = 10.0  # the rolling window of stats()["window"]
SNAPSHOT_S = 1.0  # how often the window's snapshots are taken (at most)
CHEAP_S = 20e-6  # calls cheaper than this on average are timed one in SAMPLE_EVERY
SAMPLE_EVERY = 16
LEARN_CALLS = 64  # calls timed before deciding

Hook = Callable[[dict[str, Any]], Any]


class History:
    """Snapshots of totals, about one a second, reaching back a little over ``WINDOW_S``."""

    def __init__(self) -> None:
        self._snaps: collections.deque[tuple[float, dict[str, Any]]] = collections.deque()

    def add(self, now: float, totals: dict[str, Any]) -> None:
        snaps = self._snaps
        snaps.append((now, totals))
        while len(snaps) > 2 and snaps[1][0] <= now - WINDOW_S:
            snaps.popleft()

    def window(self, now: float) -> tuple[dict[str, Any], float] | None:
        """The oldest snapshot within ``WINDOW_S`` (or the last one older than that) and
        its age; None without a snapshot."""
        snaps = list(self._snaps)
        for when, totals in snaps:
            if when >= now - WINDOW_S or when == snaps[-1][0]:
                return totals, now - when
        return None


class Clock:
    """The time and output counters of one iterator, its history and its hooks.

    It holds no reference to its iterator (no cycle: an iterator that is dropped is
    collected at once, which is what stops its threads and workers); the iterator is
    passed to each call instead.

    Args:
        totals: ``totals(iterator)``, the iterator's totals (for the window's
            snapshots); called at most once per ``SNAPSHOT_S`` from ``next()``.
        exact: time every call (the device feed, whose calls are a training step's).
    """

    def __init__(self, totals: Callable[[Any], dict[str, Any]], exact: bool = False) -> None:
        self.made = time.monotonic()
        self.first: float | None = None  # when the first next() returned
        self.first_s = 0.0  # how long the first next() took (start-up)
        self.calls = 0  # calls after the first
        self.timed_calls = 0  # of which timed
        self.timed_s = 0.0  # the seconds of the timed ones
        self.outputs = 0
        self.thread = 0  # the thread that called it last (threading.get_ident)
        self.period = 1  # time one call in `period`
        self._exact = exact
        self.history = History()
        self._totals = totals
        self._snap_due = 0.0  # when to take the next snapshot
        self._due = 0.0  # when to look at the snapshot and the hooks again
        self._hooks: list[list[Any]] = []  # [callback, every_s, next due]

    def call(self, owner: Any, next_fn: Callable[[Any], Any]) -> Any:
        """Runs ``next_fn(owner)`` (the iterator's own ``__next__``), counted and, one
        call in ``period``, timed."""
        if self.first is not None:
            self.calls += 1
            if self.calls % self.period:
                value = next_fn(owner)
                self.outputs += 1
                return value
        began = time.monotonic()
        try:
            value = next_fn(owner)
            self.outputs += 1
            return value
        finally:
            now = time.monotonic()
            spent = now - began
            self.thread = threading.get_ident()
            if self.first is None:  # start-up: reported apart, not as waiting
                self.first, self.first_s = now, spent
            else:
                self.timed_calls += 1
                self.timed_s += spent
                if self.timed_calls == LEARN_CALLS and not self._exact and self.timed_s < CHEAP_S * LEARN_CALLS:
                    self.period = SAMPLE_EVERY
            if now >= self._due:
                self.tick(owner, now)

    def wait_s(self) -> float:
        """Seconds callers spent in ``next()``, the first call excepted (an estimate
        scaled up from the timed calls once the clock samples)."""
        if not self.timed_calls:
            return 0.0
        if self.timed_calls == self.calls:
            return self.timed_s
        return self.timed_s * self.calls / self.timed_calls

    def inside_s(self) -> float:
        """Seconds callers spent in ``next()``, the first call included."""
        return self.first_s + self.wait_s()

    def tick(self, owner: Any, now: float) -> None:
        """Takes the window's snapshot and runs the hooks that are due."""
        if now >= self._snap_due:
            self._snap_due = now + SNAPSHOT_S
            self.history.add(now, self._totals(owner))
        for hook in self._hooks:
            if now >= hook[2]:
                hook[2] = now + hook[1]
                hook[0](owner.stats())
        self._due = min([self._snap_due, *(hook[2] for hook in self._hooks)])

    def add_hook(self, callback: Hook, every_s: float) -> None:
        """Calls ``callback(iterator.stats())`` from ``next()`` every ``every_s`` seconds
        (checked on timed calls: with a fast stream, one in ``SAMPLE_EVERY``)."""
        if not callable(callback):
            raise TypeError(f"a stats hook must be callable with the stats dict, got {callback!r}")
        if isinstance(every_s, bool) or not isinstance(every_s, (int, float)) or not every_s > 0:
            raise ValueError(f"every_s must be a positive number of seconds, got {every_s!r}")
        due = time.monotonic() + every_s
        self._hooks.append([callback, float(every_s), due])
        self._due = min(self._due, due)

    def active_s(self, now: float) -> float:
        """Seconds since the first ``next()`` returned (0 before it)."""
        return now - self.first if self.first is not None else 0.0
