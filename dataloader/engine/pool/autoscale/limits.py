"""The limits of the container this process runs in: memory, CPUs, processes, OOM kills.

A process in a container sees the host's ``/proc/meminfo`` and ``os.cpu_count()``; what
it may really use is set by its control groups. :func:`read_limits` reads them for this
process from ``/proc/self/cgroup`` and ``/proc/self/mountinfo``, for both layouts:

* cgroup v2 (one hierarchy, ``0::/path``): ``memory.max``, ``memory.high``,
  ``memory.current``, ``memory.peak``, ``memory.events`` (``oom_kill``), ``cpu.max``,
  ``pids.max``, ``pids.current``;
* cgroup v1 (one hierarchy per controller, ``4:memory:/path``):
  ``memory.limit_in_bytes``, ``memory.soft_limit_in_bytes``, ``memory.usage_in_bytes``,
  ``memory.max_usage_in_bytes``, ``memory.oom_control`` (``oom_kill``),
  ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``, ``pids.max``, ``pids.current``.

On a hybrid host (v1 controllers beside an empty v2 tree) a controller is read where it
is mounted. A limit set on a parent group binds its children too, so each limit is the
smallest along the path from this process's group up to the top of the mount (a
container sees no higher). A group without a limit writes ``max`` (v2) or a huge number
(v1: 9223372036854771712); both read as no limit.

What the rest of the pool uses:

* memory available = the smallest of the host's ``MemAvailable`` and, at each level
  with a limit, the limit less the memory in use there. In use is the group's usage
  less its inactive file cache (``inactive_file`` of ``memory.stat``), which the kernel
  reclaims before it kills anything (the "working set" of ``docker stats`` and the
  kubelet). ``memory.high`` (v2) counts as a limit: above it the kernel throttles the
  group. A v1 soft limit only matters when the host runs short; it is reported, not
  budgeted.
* CPUs = the smallest of the CPUs this process may run on (``os.sched_getaffinity``,
  which a cpuset restricts) and ``ceil(quota / period)`` of the CPU quota.
* process room = the smallest ``pids.max - pids.current`` along the path (threads count).

Every function takes ``root`` (default ``/``), under which ``proc/`` and the cgroup
mounts are looked up, so tests build fake trees. Nothing here raises on a missing or
odd file: an unreadable limit is no limit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
from typing import Any, NamedTuple

UNLIMITED_V1 = 9223372036854771712  # what v1 writes for "no limit" (LONG_MAX rounded to pages)


@dataclasses.dataclass(frozen=True)
class Limit:
    """One limit that binds: its value and the file it was read from."""

    value: int
    source: str  # the file, e.g. /sys/fs/cgroup/memory/job/memory.limit_in_bytes

    @property
    def name(self) -> str:
        """The file's name (``memory.max``), for messages."""
        return os.path.basename(self.source)


@dataclasses.dataclass(frozen=True)
class Limits:
    """The limits of this process (see the module docstring); None: none, or unknown.

    Attributes:
        memory: the smallest hard memory limit along the path (``memory.max``,
            ``memory.limit_in_bytes``).
        memory_high: the smallest ``memory.high`` (v2), where it is below ``memory``.
        memory_soft: the smallest v1 ``memory.soft_limit_in_bytes`` (reported only).
        memory_room: the smallest ``limit - in use`` over the levels with a limit.
        memory_peak: the most the limiting group ever used (``memory.peak``,
            ``memory.max_usage_in_bytes``).
        host_available: the host's ``MemAvailable``; ``host_total`` its ``MemTotal``.
        affinity: CPUs this process may run on; ``cpu_quota``: the quota in CPUs
            (``quota / period``, the smallest along the path).
        pids_max, pids_room: the smallest ``pids.max``, and ``pids.max - pids.current``.
        oom_kills: the OOM kills counted for this process's memory group
            (``memory.events`` or ``memory.oom_control``), or, without one, by the host
            (``/proc/vmstat``); ``oom_source`` the file.
    """

    memory: Limit | None = None
    memory_high: Limit | None = None
    memory_soft: Limit | None = None
    memory_room: int | None = None
    memory_peak: int | None = None
    host_available: int | None = None
    host_total: int | None = None
    affinity: int = 1
    cpu_quota: Limit | None = None
    cpu_period: int = 100_000
    pids_max: Limit | None = None
    pids_room: int | None = None
    oom_kills: int | None = None
    oom_source: str | None = None

    @property
    def memory_cap(self) -> Limit | None:
        """The memory limit that binds first (``memory.high`` when it is lower)."""
        if self.memory_high is not None and (self.memory is None or self.memory_high.value < self.memory.value):
            return self.memory_high
        return self.memory

    @property
    def available_memory(self) -> int | None:
        """Bytes that may still be used: min(host ``MemAvailable``, limit - in use)."""
        found = [v for v in (self.host_available, self.memory_room) if v is not None]
        return max(0, min(found)) if found else None

    @property
    def total_memory(self) -> int | None:
        """Bytes this process may use in all: the limit, or the host's memory."""
        cap = self.memory_cap
        if cap is not None and (self.host_total is None or cap.value < self.host_total):
            return cap.value
        return self.host_total

    @property
    def cpus(self) -> int:
        """CPUs this process can use: min(affinity, ceil(quota / period)), at least 1."""
        if self.cpu_quota is None:
            return max(1, self.affinity)
        return max(1, min(self.affinity, math.ceil(self.cpu_quota.value / self.cpu_period)))

    def cpu_words(self) -> str:
        """Where the CPU count comes from, e.g. ``"2 CPUs (cpu.max allows 1.5)"``."""
        count = self.cpus
        if self.cpu_quota is not None and count < self.affinity:
            share = self.cpu_quota.value / self.cpu_period
            return f"{count} CPU{'s' if count != 1 else ''} ({self.cpu_quota.name} allows {share:g})"
        return f"{count} CPU{'s' if count != 1 else ''}"

    def summary(self) -> dict[str, Any]:
        """The limits that bind, as plain JSON values (``stats()["pipeline"]["container"]``,
        what the advice reads): ``cpus``, and where a container sets them, the CPU quota
        and its file, the memory limit in MiB and its file (None where none binds)."""
        quota = self.cpu_quota
        binds = quota is not None and self.cpus < self.affinity
        cap = self.memory_cap if self.memory_words() is not None else None
        return {
            "cpus": self.cpus,
            "cpu_quota": quota.value / self.cpu_period if binds and quota else None,
            "cpu_limit": quota.name if binds and quota else None,
            "memory_mb": cap.value / 2**20 if cap else None,
            "memory_limit": cap.name if cap else None,
        }

    def memory_words(self) -> str | None:
        """The memory limit as a phrase, e.g. ``"1.4 GiB (memory.max)"``; None: no limit."""
        cap = self.memory_cap
        if cap is None or (self.host_total is not None and cap.value >= self.host_total):
            return None
        return f"{gib(cap.value)} ({cap.name})"


def gib(value: float) -> str:
    """Bytes as a short human figure: ``1.4 GiB``, ``300 MiB``, ``12 KiB``."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= size:
            scaled = value / size
            return f"{scaled:.1f} {unit}" if scaled < 10 else f"{scaled:.0f} {unit}"
    return f"{int(value)} B"


# -- reading files --------------------------------------------------------------------------


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


def _number(path: str) -> int | None:
    """A file holding one number; None for ``max``, v1's unlimited value, or no file."""
    text = _read(path)
    if text is None:
        return None
    word = text.strip().split()[0] if text.strip() else ""
    if word == "max":
        return None
    try:
        value = int(word)
    except ValueError:
        return None
    return None if value < 0 or value >= UNLIMITED_V1 else value


def _keyed(path: str) -> dict[str, int]:
    """A ``key value`` per line file (``memory.stat``, ``memory.events``, ``/proc/vmstat``)."""
    found: dict[str, int] = {}
    for line in (_read(path) or "").splitlines():
        parts = line.split()
        if len(parts) >= 2:
            with contextlib.suppress(ValueError):
                found[parts[0]] = int(parts[1])
    return found


def meminfo(root: str = "/") -> dict[str, int]:
    """``/proc/meminfo`` in bytes (empty where there is none)."""
    found: dict[str, int] = {}
    for line in (_read(os.path.join(root, "proc/meminfo")) or "").splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        with contextlib.suppress(ValueError, IndexError):
            found[key] = int(parts[0]) * (1024 if parts[-1] == "kB" else 1)
    return found


def _unescape(path: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), path)


def cgroup_dirs(root: str = "/") -> dict[str, str]:
    """The directory of this process's group for each controller (``"memory"``,
    ``"cpu"``, ``"pids"``), v1 where a controller is mounted there, else v2; also
    ``""`` for the v2 group and ``"mount:<controller>"`` for the top of its mount."""
    groups: dict[str, str] = {}  # controller ("" for v2) -> path in the hierarchy
    for line in (_read(os.path.join(root, "proc/self/cgroup")) or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for name in controllers.split(",") if controllers else [""]:
            groups[name] = path
    mounts: dict[str, tuple[str, str]] = {}  # controller ("" for v2) -> (mount root, mount point)
    for line in (_read(os.path.join(root, "proc/self/mountinfo")) or "").splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        dash = fields.index("-")
        if dash < 5 or len(fields) < dash + 3:
            continue
        kind, options = fields[dash + 1], fields[dash + 3].split(",") + fields[5].split(",")
        point = os.path.join(root, _unescape(fields[4]).lstrip("/"))
        where = (_unescape(fields[3]), point)
        if kind == "cgroup2":
            mounts.setdefault("", where)
        elif kind == "cgroup":
            for name in ("memory", "cpu", "pids"):
                if name in options:
                    mounts.setdefault(name, where)
    dirs: dict[str, str] = {}
    for name in ("memory", "cpu", "pids", ""):
        key = name if name in groups and name in mounts else ""
        if key not in groups or key not in mounts:
            continue
        mount_root, point = mounts[key]
        path = groups[key]
        if mount_root != "/" and (path == mount_root or path.startswith(mount_root.rstrip("/") + "/")):
            path = path[len(mount_root):]  # the mount shows the hierarchy from mount_root down
        dirs[name] = os.path.normpath(os.path.join(point, path.lstrip("/")))
        dirs[f"mount:{name}"] = os.path.normpath(point)
        dirs[f"v1:{name}"] = "1" if key else ""
    return dirs


def _levels(dirs: dict[str, str], name: str) -> list[str]:
    """The group's directory and its parents up to the mount point, innermost first."""
    if name not in dirs:
        return []
    here, top = dirs[name], dirs[f"mount:{name}"]
    found = [here]
    while here != top and here.startswith(top):
        here = os.path.dirname(here)
        found.append(here)
    return found


def _smallest(levels: list[str], filename: str) -> Limit | None:
    best: Limit | None = None
    for level in levels:
        value = _number(os.path.join(level, filename))
        if value is not None and (best is None or value < best.value):
            best = Limit(value, os.path.join(level, filename))
    return best


class _Memory(NamedTuple):
    memory: Limit | None
    memory_high: Limit | None
    memory_soft: Limit | None
    memory_room: int | None
    memory_peak: int | None


def _memory(levels: list[str], v1: bool) -> _Memory:
    hard, usage, inactive = (
        ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
        if v1 else ("memory.max", "memory.current", "inactive_file")
    )
    room: int | None = None
    peak: int | None = None
    binding: int | None = None
    for level in levels:
        caps = [_number(os.path.join(level, hard))]
        if not v1:
            caps.append(_number(os.path.join(level, "memory.high")))
        cap = min((c for c in caps if c is not None), default=None)
        used = _number(os.path.join(level, usage))
        if cap is None or used is None:
            continue
        used -= min(used, _keyed(os.path.join(level, "memory.stat")).get(inactive, 0))
        if room is None or cap - used < room:
            room = cap - used
        if binding is None or cap < binding:
            binding = cap
            peak = _number(os.path.join(level, "memory.max_usage_in_bytes" if v1 else "memory.peak"))
    return _Memory(
        memory=_smallest(levels, hard),
        memory_high=None if v1 else _smallest(levels, "memory.high"),
        memory_soft=_smallest(levels, "memory.soft_limit_in_bytes") if v1 else None,
        memory_room=room,
        memory_peak=peak,
    )


def _cpu_quota(levels: list[str], v1: bool) -> tuple[Limit | None, int]:
    """The smallest quota along the path, scaled to a period of 100 ms; and that period."""
    best: Limit | None = None
    period = 100_000
    for level in levels:
        if v1:
            quota = _number(os.path.join(level, "cpu.cfs_quota_us"))
            per = _number(os.path.join(level, "cpu.cfs_period_us"))
            source = os.path.join(level, "cpu.cfs_quota_us")
        else:
            words = (_read(os.path.join(level, "cpu.max")) or "").split()
            quota = int(words[0]) if words and words[0].isdigit() else None
            per = int(words[1]) if len(words) > 1 and words[1].isdigit() else None
            source = os.path.join(level, "cpu.max")
        if quota is None or not per:
            continue
        scaled = quota * period // per
        if best is None or scaled < best.value:
            best = Limit(scaled, source)
    return best, period


def oom_kills(root: str = "/", dirs: dict[str, str] | None = None) -> tuple[int | None, str | None]:
    """OOM kills counted for this process's memory group, or by the host without one:
    ``(count, file)``; ``(None, None)`` where nothing counts them."""
    dirs = cgroup_dirs(root) if dirs is None else dirs
    if "memory" in dirs:
        name = "memory.oom_control" if dirs.get("v1:memory") else "memory.events"
        path = os.path.join(dirs["memory"], name)
        found = _keyed(path)
        if "oom_kill" in found:
            return found["oom_kill"], path
    path = os.path.join(root, "proc/vmstat")
    found = _keyed(path)
    if "oom_kill" in found:
        return found["oom_kill"], path
    return None, None


def read_limits(root: str = "/", affinity: int | None = None) -> Limits:
    """The limits of this process (see the module docstring).

    Args:
        root: where ``proc/`` and the cgroup mounts are (tests pass a fake tree).
        affinity: CPUs this process may run on (None: ``os.sched_getaffinity``).
    """
    dirs = cgroup_dirs(root)
    info = meminfo(root)
    if affinity is None:
        try:
            affinity = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):  # not Linux
            affinity = os.cpu_count() or 1
    memory = _memory(_levels(dirs, "memory"), bool(dirs.get("v1:memory")))
    quota, period = _cpu_quota(_levels(dirs, "cpu"), bool(dirs.get("v1:cpu")))
    pid_levels = _levels(dirs, "pids")
    pids_room: int | None = None
    for level in pid_levels:
        most, now = _number(os.path.join(level, "pids.max")), _number(os.path.join(level, "pids.current"))
        if most is not None and now is not None and (pids_room is None or most - now < pids_room):
            pids_room = most - now
    kills, source = oom_kills(root, dirs)
    return Limits(
        host_available=info.get("MemAvailable"),
        host_total=info.get("MemTotal"),
        affinity=affinity,
        cpu_quota=quota,
        cpu_period=period,
        pids_max=_smallest(pid_levels, "pids.max"),
        pids_room=pids_room,
        oom_kills=kills,
        oom_source=source,
        **memory._asdict(),
    )
