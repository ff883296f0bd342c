"""Telling a worker killed by the kernel's OOM killer from a worker killed by its data.

Both die by ``SIGKILL``; only the kernel knows which. It says so in two places:

* the OOM-kill counter of this process's memory group (``oom_kill`` in
  ``memory.events`` or ``memory.oom_control``; :mod:`.limits`), or of the host
  (``/proc/vmstat``) outside one: a worker that died by ``SIGKILL`` while the counter
  rose since the pool last looked was, most likely, killed for memory. Each such death
  takes one kill off the rise, so two deaths need two kills;
* the kernel log (``/dev/kmsg``), which names the process killed and its size. Only
  root reads it, and seldom inside a container; where it is readable it gives the
  worker's size, where it is not the counter alone decides and the message gives the
  size of a worker the pool measured instead.

A memory kill is not the pipeline's fault of one record: the message says which limit
was reached and what to lower, not "find the record that crashes".
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
from typing import NamedTuple

from dataloader.engine.pool.autoscale.limits import Limits, gib, oom_kills, read_limits

logger = logging.getLogger("dataloader")

MAX_LOG_RECORDS = 100_000  # records of the kernel log read at most (its buffer holds fewer)
_KILLED = re.compile(
    r"Killed process (\d+) \(.*?\).*?anon-rss:(\d+)kB, file-rss:(\d+)kB, shmem-rss:(\d+)kB"
)


def kernel_log_rss(pid: int, path: str = "/dev/kmsg") -> int | None:
    """The resident size (bytes) the kernel log gives for the last OOM kill of ``pid``;
    None where the log does not name it or cannot be read (not root, a container)."""
    found: int | None = None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        for _ in range(MAX_LOG_RECORDS):
            try:
                record = os.read(fd, 8192)
            except BrokenPipeError:  # records overwritten while reading: go on
                continue
            except OSError:  # BlockingIOError: the end; anything else: stop
                break
            if not record:
                break
            if b"Killed process" in record:  # /dev/kmsg gives one record a read, a file more
                for match in _KILLED.finditer(record.decode("utf-8", "replace")):
                    if int(match.group(1)) == pid:
                        found = sum(int(match.group(i)) for i in (2, 3, 4)) * 1024
    finally:
        os.close(fd)
    return found


class Oom(NamedTuple):
    """A worker the OOM killer took: its slot, its size (None: unknown) and the limits
    read just after."""

    worker: int
    rss: int | None
    limits: Limits
    counter: str | None  # the file whose oom_kill rose (its name goes in the message)

    def message(self, live_workers: int, worker_bytes: int = 0) -> str:
        """What happened and what to do (see the module docstring)."""
        size = f" at {gib(self.rss)}" if self.rss else ""
        where = self.limits.memory_words()
        if where is not None:
            allows = f"the container allows {where}"
            if self.limits.memory_peak:
                allows += f" and its memory peaked at {gib(self.limits.memory_peak)}"
        elif self.limits.host_total:
            allows = f"the machine has {gib(self.limits.host_total)} (no container memory limit)"
        else:
            allows = "memory ran out"
        measured = (
            f"; a worker held {gib(worker_bytes)} of its own when it started" if worker_bytes and not self.rss else ""
        )
        told = f" ({os.path.basename(self.counter)}: oom_kill rose)" if self.counter and not self.rss else ""
        return (
            f"worker {self.worker} was killed by the kernel's OOM killer{size}{told}; {allows}, "
            f"with {live_workers} worker{'s' if live_workers != 1 else ''} running{measured}. "
            f"Lower worker_count or worker_buffer_size (or AutoWorkers(max_workers=...)), "
            f"make the operations hold less memory, or give the container more memory"
        )


class OomWatch:
    """The OOM kills of one pool's workers (see the module docstring).

    Args:
        root: where ``proc/`` and the cgroup mounts are (tests pass a fake tree).
        kmsg: the kernel log (tests pass a file, or a path that does not exist).
    """

    def __init__(self, root: str = "/", kmsg: str = "/dev/kmsg") -> None:
        self._root, self._kmsg = root, kmsg
        self._seen, _ = oom_kills(root)
        self.kills = 0  # workers of this pool the OOM killer took

    def died(self, worker: int, pid: int, code: int) -> Oom | None:
        """A worker (slot ``worker``, process ``pid``) ended with exit code ``code``
        (negative: a signal): an :class:`Oom` if the OOM killer did it, else None."""
        if code != -signal.SIGKILL:
            return None
        count, counter = oom_kills(self._root)
        rss = None
        if count is not None and self._seen is not None:
            if count <= self._seen:
                return None  # SIGKILL from someone else (a user, a stall timeout, a job manager)
            self._seen += 1
        else:
            rss = kernel_log_rss(pid, self._kmsg)  # no counter: only the log can tell
            if rss is None:
                return None
        if rss is None:
            rss = kernel_log_rss(pid, self._kmsg)
        self.kills += 1
        limits = read_limits(self._root)
        return Oom(worker, rss, limits, counter)

    def report(self, worker: int, pid: int, code: int, live_workers: int, worker_bytes: int = 0) -> str | None:
        """:meth:`died`, logged as a warning (the pool replaces the worker and computes its
        units again, so without the warning an OOM loop would go unseen); returns the
        message for an error, or None when it was not the OOM killer."""
        oom = None
        with contextlib.suppress(OSError, ValueError):  # telling must never break the pool
            oom = self.died(worker, pid, code)
        if oom is None:
            return None
        text = oom.message(live_workers, worker_bytes)
        logger.warning("granary: %s; its units are computed again by a new worker", text)
        return text
