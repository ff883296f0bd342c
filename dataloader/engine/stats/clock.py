"""Per-iterator clocks: time in ``next()``, a rolling window, and periodic hooks.

Every iterator (the loader's, each iterator-level stage, the device feed) owns one
:class:`Clock`, and its ``__next__`` runs inside :meth:`Clock.timed`, which measures

* ``wait_s``: the seconds callers spent inside this iterator's ``next()``, but the
  first call, which is start-up (``first_s``: workers starting, the first unit);
* ``own_s``: the part not spent inside the ``next()`` of another timed iterator on the
  same thread (the stage's own work: a packer's packing, a map's function). Nested
  calls are subtracted with a thread-local counter, so a stage whose parent runs in a
  prefetch thread is charged only for what ran on its own thread;
* ``outputs``: the elements it handed out.

Once a second, at most, a call also takes a snapshot of the iterator's totals
(:class:`History`), from which ``stats()["window"]`` is the difference, and runs the
hooks that are due (``add_stats_hook``). Cost: about a microsecond per call (four clock
reads and a few attribute updates), so it is paid per batch by the loader and per
element only by stages that already run Python per element.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from typing import Any

WINDOW_S = 10.0  # the rolling window of stats()["window"]
SNAPSHOT_S = 1.0  # how often the window's snapshots are taken (at most)

_nested = threading.local()  # .inner: seconds spent in timed next() calls nested in the current one

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
    """

    def __init__(self, totals: Callable[[Any], dict[str, Any]]) -> None:
        self.made = time.monotonic()
        self.first: float | None = None  # when the first next() returned
        self.first_s = 0.0  # how long the first next() took (start-up)
        self.wait_s = 0.0  # time in next() after the first
        self.own_s = 0.0
        self.outputs = 0
        self.history = History()
        self._totals = totals
        self._snap_due = 0.0  # when to take the next snapshot
        self._due = 0.0  # when to look at the snapshot and the hooks again
        self._hooks: list[list[Any]] = []  # [callback, every_s, next due]
        self._active = False

    def timed(self, owner: Any, next_fn: Callable[[Any], Any]) -> Any:
        """Runs ``next_fn(owner)`` (the iterator's own ``__next__``) under the clock."""
        if self._active:  # a subclass's __next__ calling super().__next__()
            return next_fn(owner)
        self._active = True
        outer = getattr(_nested, "inner", 0.0)
        _nested.inner = 0.0
        began = time.monotonic()
        try:
            value = next_fn(owner)
            self.outputs += 1
            return value
        finally:
            now = time.monotonic()
            spent = now - began
            if self.first is None:  # start-up: reported apart, not as waiting
                self.first, self.first_s = now, spent
            else:
                self.wait_s += spent
            self.own_s += spent - _nested.inner
            _nested.inner = outer + spent
            self._active = False
            if now >= self._due:
                self.tick(owner, now)

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
        """Calls ``callback(iterator.stats())`` from ``next()`` every ``every_s`` seconds."""
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
