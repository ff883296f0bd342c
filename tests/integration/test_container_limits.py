"""Container limits in real cgroups: an OOM kill is reported as one,
``worker_count="auto"`` stays within the memory limit, and a CPU quota and a pids limit
set the worker counts.

Each test makes a cgroup with a small limit (memory: and no swap), runs a child script
that moves itself into it, and reads what the child prints. Making a cgroup needs root
and a writable cgroup mount (v1 ``/sys/fs/cgroup/<controller>`` or v2 with the
controller delegated); elsewhere (CI as a user, a container) the tests are skipped and
say why. Nothing waits on a clock: the OOM case kills the same worker on every try, and
the auto case checks a bound (never more workers than the memory holds, no OOM kill),
whatever the count the pool reaches.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from dataloader.engine.pool.autoscale import limits

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(240)]

MIB = 2**20
ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def cgroup(controller: str, v1: dict[str, str], v2: dict[str, str]) -> Iterator[Path]:
    """A new cgroup of ``controller`` with the files ``v1`` or ``v2`` (as the layout is)
    written in order (a file missing after the first is skipped); its directory. Removed
    on exit, after killing what is left in it (only the test's child runs there)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("cgroups are Linux only")
    if os.geteuid() != 0:
        pytest.skip(f"making a {controller} cgroup needs root (this run is not root, as on CI)")
    dirs = limits.cgroup_dirs()
    if f"mount:{controller}" not in dirs:
        pytest.skip(f"no cgroup {controller} controller is mounted here")
    files = v1 if dirs.get(f"v1:{controller}") else v2
    path = Path(dirs[f"mount:{controller}"]) / f"granary-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        path.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot make a {controller} cgroup under {path.parent}: {exc}")
    try:
        first = next(iter(files))
        if not (path / first).exists():
            pytest.skip(f"{path.parent} does not delegate the {controller} controller ({first} is missing)")
        for name, value in files.items():
            if name == first or (path / name).exists():
                (path / name).write_text(value)
        yield path
    finally:
        for _ in range(50):
            with contextlib.suppress(OSError):
                for pid in (path / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
            with contextlib.suppress(FileNotFoundError):
                try:
                    path.rmdir()
                except OSError:  # its last processes are still exiting
                    time.sleep(0.1)
                    continue
            break


def memory_cgroup(limit: int) -> contextlib.AbstractContextManager[Path]:
    """A memory cgroup allowing ``limit`` bytes and no swap (over the limit the OOM
    killer acts)."""
    return cgroup("memory", {"memory.limit_in_bytes": str(limit), "memory.memsw.limit_in_bytes": str(limit)},
                  {"memory.max": str(limit), "memory.swap.max": "0"})


CHILD = r'''
import json, os, sys

with open(sys.argv[1], "w") as f:  # into the cgroup before anything is imported or started
    f.write(str(os.getpid()))

import numpy as np

import dataloader as dl
from dataloader.engine.pool.autoscale import limits, room

MIB = 2**20
mode, size = sys.argv[2], int(sys.argv[3])
found = limits.read_limits()
report = {"limit": found.memory.value if found.memory else None,
          "available": found.available_memory, "kills_before": found.oom_kills}


def hog(x):  # touches every page of more memory than the cgroup allows
    np.ones(size // 8)
    return x


ballast = []


def hold(worker_index, worker_count):  # each worker holds `size` bytes of its own
    ballast.append(np.ones(size // 8))


def slow(x):  # the consumer always waits for one worker: the pool wants more
    import time
    time.sleep(0.01)
    return x


if mode == "oom-no-log":  # as in a container: only the cgroup's counter can tell
    from dataloader.engine.pool.autoscale import oom

    oom.kernel_log_rss = lambda pid, path="/dev/kmsg": None
if mode.startswith("oom"):
    loader = dl.DataLoader(dl.RangeDataSource(8), dl.SequentialSampler(8), [dl.MapTransform(hog), dl.Batch(2)],
                           worker_count=1, warm_start=False)
    try:
        report["batches"] = sum(1 for _ in loader)
    except dl.WorkerCrashError as exc:
        report["error"] = str(exc)
elif mode == "cpu":
    report["cpus"] = found.cpus
    report["container"] = found.summary()
    report["mp_prefetch"] = dl.MapDataset.range(4).to_iter_dataset().mp_prefetch()._mp.num_workers
    report["auto_high"] = dl.AutoWorkers().bounds(found.cpus)[1]
elif mode == "pids":
    report["pids_room"] = found.pids_room
    report["room"] = room(dl.AutoWorkers(), MIB, 0, 0, None)
else:
    auto = dl.AutoWorkers(min_workers=1, max_workers=8, initial=1, interval_s=0.1)
    it = iter(dl.DataLoader(dl.RangeDataSource(300), dl.SequentialSampler(300), [dl.MapTransform(slow)],
                            worker_count=auto, worker_init_fn=hold, warm_start=False))
    report["records"] = sum(1 for _ in it)
    report["counts"] = [1] + [count for _, count in it._executor.worker_counts]
    it.close()
    host = limits.Limits(host_total=found.host_total, host_available=found.host_available)
    report["host_room"] = room(dl.AutoWorkers(), size, 0, 0, None, host)
report["kills_after"] = limits.read_limits().oom_kills
print("REPORT " + json.dumps(report), flush=True)
'''


def run_child(tmp_path: Path, cgroup: Path, mode: str, size: int) -> dict:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, str(script), str(cgroup / "cgroup.procs"), mode, str(size)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=200)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    lines = [line for line in out.splitlines() if line.startswith("REPORT ")]
    assert lines, f"the child printed no report (exit code {proc.returncode}):\n{err[-3000:]}"
    report = json.loads(lines[-1][len("REPORT "):])
    report["stderr"] = err
    return report


def test_a_worker_the_oom_killer_takes_is_reported_as_that_not_as_a_bad_record(tmp_path):
    limit = 400 * MIB
    with memory_cgroup(limit) as cgroup:
        report = run_child(tmp_path, cgroup, "oom", 2048 * MIB)  # each try wants 2 GiB
    assert report["limit"] == limit  # the child reads its cgroup's limit
    error = report.get("error")
    assert error is not None, report
    assert "was killed by the kernel's OOM killer" in error
    assert "the container allows 400 MiB (memory.limit_in_bytes)" in error or \
        "the container allows 400 MiB (memory.max)" in error
    assert "lower worker_count or worker_buffer_size" in error.lower()
    assert "find the record that crashes" not in error
    assert report["kills_after"] - report["kills_before"] >= 3  # the unit's three tries
    assert "killed by the kernel's OOM killer" in report["stderr"]  # each death is logged


def test_without_the_kernel_log_the_oom_counter_alone_tells(tmp_path):
    with memory_cgroup(400 * MIB) as group:
        report = run_child(tmp_path, group, "oom-no-log", 2048 * MIB)
    error = report.get("error")
    assert error is not None, report
    assert "worker 0 was killed by the kernel's OOM killer (memory.oom_control: oom_kill rose)" in error or \
        "worker 0 was killed by the kernel's OOM killer (memory.events: oom_kill rose)" in error
    assert "the container allows 400 MiB" in error and "find the record" not in error


def test_auto_never_grows_past_what_the_containers_memory_holds(tmp_path):
    limit, ballast = 640 * MIB, 120 * MIB
    with memory_cgroup(limit) as cgroup:
        report = run_child(tmp_path, cgroup, "auto", ballast)
    assert report["records"] == 300, report
    assert report["kills_after"] == report["kills_before"], report  # not one OOM kill
    # The host's memory alone would have allowed all 8; the container holds fewer.
    assert report["host_room"] >= 8, report
    assert max(report["counts"]) * ballast < limit, report


def test_a_cpu_quota_sets_the_default_and_auto_worker_counts(tmp_path):
    # half a CPU: one worker, whatever the host has (os.cpu_count() would say otherwise)
    with cgroup("cpu", {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "50000"},
                {"cpu.max": "50000 100000"}) as group:
        report = run_child(tmp_path, group, "cpu", 0)
    assert report["cpus"] == 1 and report["mp_prefetch"] == 1 and report["auto_high"] == 1, report
    assert report["container"]["cpu_quota"] == 0.5 or os.cpu_count() == 1, report


def test_a_pids_limit_bounds_the_workers_auto_may_add(tmp_path):
    # pids.max counts the group's tasks (threads too); the child is one process with a few threads
    with cgroup("pids", {"pids.max": "40"}, {"pids.max": "40"}) as group:
        report = run_child(tmp_path, group, "pids", 0)
    assert 0 < report["pids_room"] < 40, report
    assert report["room"] == max(0, (report["pids_room"] - 16) // 4), report  # 4 tasks a worker, 16 spare
