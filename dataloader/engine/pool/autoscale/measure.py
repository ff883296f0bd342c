"""What the :class:`~dataloader.engine.pool.autoscale.Scaler` of one pool is told.

The scheduling loop asks :meth:`Scaling.decide` at each ``next()``: it counts the ready
workers with no unit (the window was full), and, when the Scaler would add workers, how
many more the memory of one worker (the largest now, :func:`worker_memory`) and the result
blocks it needs leave room for, in the container's limits (:mod:`~dataloader.engine.pool.autoscale.limits`). The loop then
adds or retires them through its worker set.

An OOM kill in this process's memory group (its ``oom_kill`` counter rose; looked at
once per interval) means the count was too high for the memory there is, whatever the
budget said: the pool retires one worker and never grows back to the count it had.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from dataloader.engine.pool.autoscale import Scaler, private_bytes, room, usable_cpus
from dataloader.engine.pool.autoscale.limits import oom_kills

if TYPE_CHECKING:
    from dataloader.engine.pool.window import Window
    from dataloader.engine.pool.workers import Workers
    from dataloader.options import AutoWorkers


def worker_memory(workers: Workers) -> tuple[int, int]:
    """``(cost, growth)``: the private memory one more worker will cost, and what the
    live workers will still take as they grow to it.

    A worker grows as it computes (buffers, caches, a pipeline's own arrays): budgeting
    its size at start, a pool in a 1.4 GiB container added workers that each grew to
    300 MiB, and the OOM killer took them. So the cost is the most a ready worker holds
    now (at least what the first held when it started), and workers below it (just
    started, not grown yet) are counted at the cost already. Read only when the pool
    would add workers (once an interval at most).
    """
    live = workers.live()
    sizes = [private_bytes(w.pid) if w.ready else 0 for w in live]
    cost = max([workers.worker_bytes(), *sizes])
    return cost, sum(max(0, cost - size) for size in sizes)


class Scaling:
    """``worker_count="auto"`` for one pool: ``high`` slots, ``initial`` workers."""

    def __init__(self, options: AutoWorkers, buffer_size: int) -> None:
        self.options, self._buffer = options, buffer_size
        self.scaler = Scaler(options, usable_cpus(), time.monotonic())
        self.high, self.initial = self.scaler.high, self.scaler.initial
        self._kills, _ = oom_kills()
        self._looked = time.monotonic()

    def waited(self, seconds: float) -> None:
        self.scaler.waited(seconds)

    def decide(self, now: float, workers: Workers, window: Window) -> int:
        """Samples the idle workers; returns the workers to add (> 0) or retire (< 0) now."""
        live = workers.live()
        if now - self._looked >= self.options.interval_s:
            self._looked = now
            if self._oom_killed():
                return self.back_off(len(live))
        starting = bool(workers.deferred) or not all(w.ready for w in live)
        if not window.exhausted:
            self.scaler.sample(sum(1 for w in live if w.ready and not window.held(w.key)))

        def fits() -> int:
            cost, growth, block_size, blocks_room = workers.footprint()
            return room(self.options, cost, self._buffer + 1, block_size, blocks_room, reserved=growth)

        return self.scaler.decide(now, len(live), starting, fits)

    def refused(self, started: int) -> None:
        """A limit (pids, memory) refused a worker: wish no higher than ``started``."""
        self.scaler.high = max(self.scaler.low, started)

    def _oom_killed(self) -> bool:
        kills, _ = oom_kills()
        rose = kills is not None and self._kills is not None and kills > self._kills
        self._kills = kills
        return rose

    def back_off(self, live: int) -> int:
        """After an OOM kill: the ceiling drops below ``live`` (not below the floor) and
        one worker retires if that leaves the floor; returns the change (0 or -1)."""
        scaler = self.scaler
        scaler.high = max(scaler.low, min(scaler.high, live - 1))
        return -1 if live > scaler.high else 0
