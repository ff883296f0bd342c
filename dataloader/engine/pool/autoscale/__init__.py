"""``worker_count="auto"``: how many workers the pool should have, from what it measures.

Pure decisions (no processes, so they are tested with made-up measurements):
:class:`Scaler` is told how long the consumer waited for a unit and how many workers
sat idle because the window was full, and says, once per interval, how many workers to
add or retire. :func:`room` says how many more the memory (the machine's and the
container's) can hold. The pool (:mod:`~dataloader.engine.pool.executor`) does the adding and
retiring; since units, not workers, define the output, no batch changes.

Why these signals. A consumer that waits is short of workers: if it waited a share
``w`` of the wall time, the pool delivers ``1 - w`` of what is asked, so about
``live * w / (1 - w)`` more workers are missing (added at once, at most doubling). A
worker with nothing to do while the consumer never waits is spare: the window is full
of finished units the consumer has not taken. One spare is kept as headroom, so the
count does not swing back and forth at the boundary.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

from dataloader.engine.pool.autoscale import limits
from dataloader.engine.pool.autoscale.limits import Limits
from dataloader.options import AutoWorkers

WAIT_HIGH = 0.05  # the consumer waited more than this share of the time: add
WAIT_LOW = 0.01  # less than this (two intervals in a row) with idle workers: retire
# Under a pids limit (threads count as tasks): a worker is a process with a few threads
# of its own (numpy's and the transport's, when there are any); the trainer keeps some
# room for its own threads and processes.
PIDS_PER_WORKER = 4
PIDS_SPARE = 16


class Scaler:
    """The decisions of one pool (see the module docstring).

    Args:
        options: the bounds and the interval.
        cpus: CPUs this process may use (for the default bounds).
        now: the clock (``time.monotonic()``) at the start.
    """

    def __init__(self, options: AutoWorkers, cpus: int, now: float) -> None:
        self.low, self.high, self.initial = options.bounds(cpus)
        self.interval = options.interval_s
        self._calm = 0
        self._restart(now)

    def _restart(self, now: float) -> None:
        self._since = now
        self._waited = 0.0
        self._idle = 0.0
        self._samples = 0

    def waited(self, seconds: float) -> None:
        """The consumer waited ``seconds`` for the next unit."""
        self._waited += seconds

    def sample(self, idle_workers: int) -> None:
        """At a ``next()``: workers with no unit although the stream goes on."""
        self._idle += idle_workers
        self._samples += 1

    def decide(self, now: float, live: int, starting: bool, room: Callable[[], int]) -> int:
        """Workers to add (> 0) or retire (< 0) now, or 0.

        ``live``: workers that are not retiring; ``starting``: some of them are not
        ready yet (their first interval says nothing: it restarts); ``room()``: how
        many more the budget allows (asked only when adding).
        """
        elapsed = now - self._since
        if starting:
            self._restart(now)
            return 0
        if elapsed < self.interval:
            return 0
        wait = min(self._waited / elapsed, 1.0)
        idle = self._idle / self._samples if self._samples else 0.0
        self._restart(now)
        if wait > WAIT_HIGH:
            self._calm = 0
            missing = math.ceil(live * wait / max(1.0 - wait, 0.1))
            wanted = min(max(missing, 1), live, self.high - live)
            return max(0, min(wanted, room())) if wanted > 0 else 0
        if wait < WAIT_LOW and idle >= 2.0:
            self._calm += 1
            if self._calm >= 2:
                self._calm = 0
                return -min(math.floor(idle) - 1, live - self.low)
            return 0
        self._calm = 0
        return 0


def private_bytes(pid: int) -> int:
    """Memory only ``pid`` holds (private pages, what one more such process costs);
    0 when unknown."""
    total = 0
    with contextlib.suppress(OSError, ValueError), open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                total += int(line.split()[1]) * 1024
    return total


def room(
    options: AutoWorkers,
    worker_bytes: int,
    blocks_per_worker: int,
    block_bytes: int,
    shm_free: int | None,
    found: Limits | None = None,
    reserved: int = 0,
) -> int:
    """How many more workers fit: each costs ``worker_bytes`` of private memory and
    ``blocks_per_worker`` result blocks of ``block_bytes`` (shared memory, of which
    ``shm_free`` bytes are left; None: results go through pipes), and
    :data:`PIDS_PER_WORKER` tasks of a pids limit.

    Memory is what the container allows, not only what the host has
    (:mod:`~dataloader.engine.pool.autoscale.limits`, read now unless ``found`` is
    given): ``min_free_memory`` of the container's limit (or of the host's memory,
    without one) stays free, and ``reserved`` bytes are spoken for (what the workers
    already running will still grow by). Result blocks are memory too: they count in
    the cost, and at most ``max_shm_share`` of ``shm_free`` goes to them.
    """
    found = limits.read_limits() if found is None else found
    fits = 1 << 30
    blocks = blocks_per_worker * block_bytes
    cost = worker_bytes + blocks
    available, total = found.available_memory, found.total_memory
    if cost > 0 and available is not None and total is not None:
        spare = available - options.min_free_memory * total - reserved
        fits = min(fits, max(0, int(spare // cost)))
    if blocks > 0 and shm_free is not None:
        fits = min(fits, max(0, int(shm_free * options.max_shm_share // blocks)))
    if found.pids_room is not None:
        fits = min(fits, max(0, (found.pids_room - PIDS_SPARE) // PIDS_PER_WORKER))
    return fits


def usable_cpus() -> int:
    """CPUs this process may use: its affinity (a cpuset), and its container's CPU
    quota (``cpu.max``, ``cpu.cfs_quota_us``) rounded up."""
    return limits.read_limits().cpus
