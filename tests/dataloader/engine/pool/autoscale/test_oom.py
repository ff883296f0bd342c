"""An OOM kill told from other deaths, on fake cgroup trees and fake kernel logs."""

from __future__ import annotations

import logging
import signal

from dataloader.engine.pool.autoscale.oom import OomWatch, kernel_log_rss
from tests.dataloader.engine.pool.autoscale.test_limits import GIB, M1, UNLIMITED_V1, tree

MOUNTS = "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
KILL = -signal.SIGKILL


def container(tmp_path, kills: int, limit: int = 3 * GIB // 2) -> str:
    return tree(tmp_path, {
        "proc/self/mountinfo": MOUNTS, "proc/self/cgroup": "4:memory:/job\n",
        "proc/meminfo": "MemTotal: 16777216 kB\nMemAvailable: 8388608 kB\n",
        f"{M1}/job/memory.limit_in_bytes": f"{limit}\n",
        f"{M1}/job/memory.usage_in_bytes": f"{limit - 4096}\n",
        f"{M1}/job/memory.max_usage_in_bytes": f"{limit}\n",
        f"{M1}/job/memory.oom_control": f"oom_kill_disable 0\nunder_oom 0\noom_kill {kills}\n",
    })


def kmsg(tmp_path, *pids_and_kb: tuple[int, int]) -> str:
    lines = ["6,1,100,-;eth0: link up"]
    for pid, kb in pids_and_kb:
        lines.append(
            f"3,2,200,-;Memory cgroup out of memory: Killed process {pid} (python) total-vm:{kb * 2}kB, "
            f"anon-rss:{kb - 100}kB, file-rss:60kB, shmem-rss:40kB, UID:0 pgtables:100kB oom_score_adj:0"
        )
    path = tmp_path / "kmsg"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_a_sigkill_while_the_counter_rose_is_an_oom_kill(tmp_path):
    root = container(tmp_path, kills=4)
    watch = OomWatch(root, kmsg=str(tmp_path / "none"))
    container(tmp_path, kills=5)
    oom = watch.died(3, pid=1234, code=KILL)
    assert oom is not None and oom.worker == 3 and oom.rss is None
    text = oom.message(live_workers=8, worker_bytes=300 * 2**20)
    assert text.startswith("worker 3 was killed by the kernel's OOM killer (")
    assert "memory.oom_control: oom_kill rose" in text
    assert "the container allows 1.5 GiB (memory.limit_in_bytes) and its memory peaked at 1.5 GiB" in text
    assert "with 8 workers running; a worker held 300 MiB of its own when it started" in text
    assert "lower worker_count or worker_buffer_size" in text.lower() and "record" not in text
    # one kill explains one death: a second SIGKILL with no new kill is something else
    assert watch.died(4, pid=1235, code=KILL) is None


def test_other_deaths_are_not_oom_kills(tmp_path):
    root = container(tmp_path, kills=0)
    watch = OomWatch(root, kmsg=str(tmp_path / "none"))
    assert watch.died(0, pid=1, code=KILL) is None  # SIGKILL, counter unchanged: a user, a job manager
    container(tmp_path, kills=1)
    assert watch.died(0, pid=1, code=-signal.SIGSEGV) is None  # a crash, even while memory ran out
    assert watch.died(0, pid=1, code=1) is None
    assert watch.kills == 0


def test_the_kernel_log_gives_the_size_of_the_worker(tmp_path):
    root = container(tmp_path, kills=0)
    log = kmsg(tmp_path, (4321, 500_000), (1234, 900_000), (4321, 1_258_291))
    watch = OomWatch(root, kmsg=log)
    container(tmp_path, kills=1)
    oom = watch.died(3, pid=4321, code=KILL)
    assert oom is not None and oom.rss == 1_258_291 * 1024  # the last kill of that pid
    assert oom.message(live_workers=1).startswith(
        "worker 3 was killed by the kernel's OOM killer at 1.2 GiB; the container allows 1.5 GiB"
    )
    assert kernel_log_rss(999, log) is None
    assert kernel_log_rss(1, str(tmp_path / "unreadable")) is None


def test_without_a_counter_only_the_kernel_log_can_tell(tmp_path):
    root = tree(tmp_path, {"proc/meminfo": "MemTotal: 16777216 kB\nMemAvailable: 8388608 kB\n"})
    log = kmsg(tmp_path, (77, 2_000_000))
    watch = OomWatch(root, kmsg=log)
    assert watch.died(0, pid=78, code=KILL) is None
    oom = watch.died(5, pid=77, code=KILL)
    assert oom is not None
    assert oom.message(live_workers=2).startswith(
        "worker 5 was killed by the kernel's OOM killer at 1.9 GiB; the machine has 16 GiB (no container memory limit)"
    )


def test_report_logs_a_warning_and_returns_the_words(tmp_path, caplog):
    root = container(tmp_path, kills=0, limit=UNLIMITED_V1)
    watch = OomWatch(root, kmsg=str(tmp_path / "none"))
    container(tmp_path, kills=1, limit=UNLIMITED_V1)
    with caplog.at_level(logging.WARNING, logger="dataloader"):
        text = watch.report(2, 10, KILL, live_workers=4)
    assert text is not None and "the machine has 16 GiB" in text
    assert "its units are computed again by a new worker" in caplog.text
    assert watch.report(2, 11, KILL, live_workers=4) is None
