"""Changing who computes while a stream runs: ``worker_count="auto"`` adds and retires
workers, ``worker_kind="auto"`` hands the stream from threads over to processes.

:class:`Changes` is the part of :class:`~dataloader.engine.pool.executor.PoolExecutor`
that does both, with the loop's lock held. A worker leaves only once it has answered
every unit it holds, so no unit is computed twice or lost, and the output does not
change (a unit is the same whoever computes it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any, Protocol

from dataloader.engine.pool.guard import Guarded
from dataloader.engine.pool.window import Window
from dataloader.engine.pool.workers import Workers
from dataloader.errors import WorkerError

logger = logging.getLogger("dataloader")


class Decider(Protocol):
    """What decides a pool's worker count as it runs: ``worker_count="auto"``'s
    :class:`~.measure.Scaling`, or a ``RayExecutor`` following its ``scale(n)``."""

    def decide(self, now: float, workers: Workers, window: Window) -> int:
        """The workers to add (> 0) or retire (< 0) now."""

    def waited(self, seconds: float) -> None:
        """The consumer waited this long for a unit."""

    def refused(self, started: int) -> None:
        """A limit refused the workers added: ``started`` is as high as it can go."""


class Changes(Guarded):
    """Worker changes for the loop of a subclass, which keeps ``_worker_count``,
    ``worker_counts`` and ``_handing_over`` and provides ``_joined(started)``."""

    _worker_count: int
    _handing_over: int
    worker_counts: list[tuple[float, int]]

    def _joined(self, started: Iterable[Any]) -> None:
        raise NotImplementedError

    def _autoscale(self, scaling: Decider, now: float) -> None:
        """Adds or retires workers as the autoscaler decides (the highest indices retire,
        each once it has answered what it holds)."""
        workers, window = self._workers, self._window
        live = len(workers.live())
        change = scaling.decide(now, workers, window)
        if change > 0:
            try:
                self._joined(workers.add(change))
            except WorkerError as exc:
                # A limit (pids, memory) refused a worker the pool only wished for: stay
                # at what started, and wish no higher; the stream goes on.
                self._joined([])
                started = len(workers.live())
                if not started:
                    raise
                scaling.refused(started)
                logger.warning("granary: worker_count auto stays at %d workers: %s", started, exc)
                change = started - live
        elif change < 0:
            for w in workers.retire(-change):
                if not window.held(w.key):
                    self._stop_retired(w)
            self._joined([])
        if change:
            self.worker_counts.append((now, live + change))
            logger.info("granary: worker_count auto: %d -> %d workers", live, live + change)
        workers.reap_retired()

    def _hand_over(self) -> None:
        """``worker_kind="auto"`` chose processes: the threads answer what they hold,
        then as many processes take over (the units are the same whoever computes them)."""
        workers, window = self._workers, self._window
        if not self._handing_over:
            self._handing_over = max(1, len(workers.live()) + len(workers.deferred))
        for w in workers.retire(len(workers.live())):
            if not window.held(w.key):
                self._stop_retired(w)
        workers.deferred.clear()
        self._joined([])
        if workers.workers:
            return  # they answer first; no unit goes out meanwhile (the window is 0)
        self._finalizer.detach()
        workers.close()
        self._own(workers.handover(self._worker_count))
        self._window.clear_workers()
        count, self._handing_over = self._handing_over, 0
        self._joined(self._workers.start(count, spare_a_core=False))
        self.worker_counts.append((time.monotonic(), count))

    def _stop_retired(self, w: Any) -> None:
        self._window.remove_worker(w.key)
        self._workers.stop(w)
