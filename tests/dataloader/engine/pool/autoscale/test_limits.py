"""Container limits read from fake cgroup trees (v1, v2, hybrid), built in tmp_path."""

from __future__ import annotations

from pathlib import Path

import pytest

from dataloader.engine.pool.autoscale import limits
from dataloader.engine.pool.autoscale.limits import UNLIMITED_V1, Limit, Limits, gib, read_limits

GIB = 2**30
MIB = 2**20

V1_MOUNTS = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
V1_GROUPS = "8:pids:/job\n4:memory:/job/step\n2:cpu,cpuacct:/job\n0::/\n"
V2_MOUNTS = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
V2_GROUPS = "0::/job/step\n"


def tree(root: Path, files: dict[str, str]) -> str:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(root)


def host(total_gib: float = 16, available_gib: float = 12) -> dict[str, str]:
    return {"proc/meminfo": f"MemTotal: {int(total_gib * 2**20)} kB\nMemAvailable: {int(available_gib * 2**20)} kB\n"}


def v1(tmp_path, **files: str) -> str:
    base = {"proc/self/mountinfo": V1_MOUNTS, "proc/self/cgroup": V1_GROUPS, **host()}
    return tree(tmp_path, {**base, **{k.replace("__", "/"): v for k, v in files.items()}})


def v2(tmp_path, files: dict[str, str]) -> str:
    return tree(tmp_path, {"proc/self/mountinfo": V2_MOUNTS, "proc/self/cgroup": V2_GROUPS, **host(), **files})


M1 = "sys/fs/cgroup/memory"
V2 = "sys/fs/cgroup"


def test_v1_memory_limit_is_the_smallest_along_the_path(tmp_path):
    root = tree(tmp_path, {
        "proc/self/mountinfo": V1_MOUNTS, "proc/self/cgroup": V1_GROUPS, **host(),
        f"{M1}/memory.limit_in_bytes": f"{UNLIMITED_V1}\n",
        f"{M1}/job/memory.limit_in_bytes": f"{3 * GIB // 2}\n",  # the parent's limit binds the child
        f"{M1}/job/memory.usage_in_bytes": f"{GIB // 2}\n",
        f"{M1}/job/memory.max_usage_in_bytes": f"{GIB}\n",
        f"{M1}/job/step/memory.limit_in_bytes": f"{UNLIMITED_V1}\n",
        f"{M1}/job/step/memory.usage_in_bytes": f"{GIB // 4}\n",
        f"{M1}/job/step/memory.soft_limit_in_bytes": f"{GIB}\n",
        f"{M1}/job/step/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n",
    })
    found = read_limits(root, affinity=8)
    assert found.memory == Limit(3 * GIB // 2, f"{root}/{M1}/job/memory.limit_in_bytes")
    assert found.memory_soft is not None and found.memory_soft.value == GIB
    assert found.memory_room == GIB  # 1.5 GiB less the 0.5 GiB the parent's group uses
    assert found.available_memory == GIB  # the host has 12 GiB available: the group binds
    assert found.total_memory == 3 * GIB // 2
    assert found.memory_peak == GIB
    assert found.memory_words() == "1.5 GiB (memory.limit_in_bytes)"
    assert (found.oom_kills, found.oom_source) == (3, f"{root}/{M1}/job/step/memory.oom_control")


def test_v1_inactive_file_cache_does_not_count_as_used(tmp_path):
    root = v1(tmp_path, **{
        f"{M1}/job/step/memory.limit_in_bytes": f"{2 * GIB}",
        f"{M1}/job/step/memory.usage_in_bytes": f"{2 * GIB - MIB}",  # mostly page cache
        f"{M1}/job/step/memory.stat": f"cache 100\ntotal_inactive_file {GIB}\n",
    })
    assert read_limits(root, affinity=2).memory_room == GIB + MIB


def test_unlimited_v1_and_missing_files_read_as_no_limit(tmp_path):
    root = v1(tmp_path, **{f"{M1}/job/step/memory.limit_in_bytes": f"{UNLIMITED_V1}\n",
                           f"{M1}/job/step/memory.usage_in_bytes": "4096\n"})
    found = read_limits(root, affinity=4)
    assert found.memory is None and found.memory_room is None
    assert found.available_memory == 12 * GIB and found.total_memory == 16 * GIB
    assert found.memory_words() is None
    assert found.cpus == 4 and found.pids_room is None and found.oom_kills is None


def test_v1_cpu_quota_rounds_up_and_affinity_caps_it(tmp_path):
    root = v1(tmp_path, **{"sys/fs/cgroup/cpu,cpuacct/job/cpu.cfs_quota_us": "150000\n",
                           "sys/fs/cgroup/cpu,cpuacct/job/cpu.cfs_period_us": "100000\n",
                           "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
                           "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n"})
    assert read_limits(root, affinity=8).cpus == 2  # ceil(1.5)
    assert read_limits(root, affinity=8).cpu_words() == "2 CPUs (cpu.cfs_quota_us allows 1.5)"
    assert read_limits(root, affinity=1).cpus == 1  # the cpuset is smaller still
    assert read_limits(root, affinity=8).summary() == {
        "cpus": 2, "cpu_quota": 1.5, "cpu_limit": "cpu.cfs_quota_us", "memory_mb": None, "memory_limit": None,
    }


def test_v1_pids_room_is_the_smallest_along_the_path(tmp_path):
    root = v1(tmp_path, **{"sys/fs/cgroup/pids/pids.max": "max\n", "sys/fs/cgroup/pids/pids.current": "900\n",
                           "sys/fs/cgroup/pids/job/pids.max": "100\n", "sys/fs/cgroup/pids/job/pids.current": "37\n"})
    found = read_limits(root, affinity=2)
    assert found.pids_room == 63 and found.pids_max is not None and found.pids_max.value == 100


def test_v2_memory_max_high_and_events(tmp_path):
    root = v2(tmp_path, {
        f"{V2}/memory.max": "max\n",  # the top of the mount: no limit
        f"{V2}/job/memory.max": f"{2 * GIB}\n",
        f"{V2}/job/memory.current": f"{GIB}\n",
        f"{V2}/job/step/memory.max": "max\n",
        f"{V2}/job/step/memory.high": f"{3 * GIB // 2}\n",
        f"{V2}/job/step/memory.current": f"{GIB}\n",
        f"{V2}/job/step/memory.stat": f"anon 1\ninactive_file {GIB // 4}\n",
        f"{V2}/job/step/memory.peak": f"{GIB + MIB}\n",
        f"{V2}/job/step/memory.events": "low 0\nhigh 12\nmax 3\noom 2\noom_kill 2\noom_group_kill 0\n",
        f"{V2}/job/cpu.max": "max 100000\n",
        f"{V2}/job/step/cpu.max": "50000 100000\n",
        f"{V2}/job/step/pids.max": "max\n",
        f"{V2}/job/pids.max": "64\n",
        f"{V2}/job/pids.current": "60\n",
    })
    found = read_limits(root, affinity=16)
    assert found.memory is not None and found.memory.value == 2 * GIB and found.memory.name == "memory.max"
    assert found.memory_high is not None and found.memory_high.value == 3 * GIB // 2
    assert found.memory_cap == found.memory_high  # above memory.high the kernel throttles
    # step: 1.5 GiB high less (1 GiB - 0.25 GiB inactive cache); job: 2 GiB less 1 GiB
    assert found.memory_room == 3 * GIB // 4
    assert found.memory_peak == GIB + MIB  # of the group whose limit binds
    assert found.memory_words() == "1.5 GiB (memory.high)"
    assert found.cpus == 1 and found.cpu_words() == "1 CPU (cpu.max allows 0.5)"
    assert found.pids_room == 4
    assert (found.oom_kills, found.oom_source) == (2, f"{root}/{V2}/job/step/memory.events")


def test_v2_with_no_limits_falls_back_to_the_host(tmp_path):
    root = v2(tmp_path, {f"{V2}/job/step/memory.max": "max\n", f"{V2}/job/step/cpu.max": "max 100000\n",
                         "proc/vmstat": "nr_free_pages 1\noom_kill 7\n"})
    found = read_limits(root, affinity=3)
    assert found.memory is None and found.available_memory == 12 * GIB and found.cpus == 3
    assert (found.oom_kills, found.oom_source) == (7, f"{root}/proc/vmstat")  # the host's count


def test_a_namespaced_mount_maps_the_group_path_below_its_root(tmp_path):
    # Docker without a cgroup namespace: the mount shows the hierarchy from /docker/abc down.
    mounts = "40 31 0:32 /docker/abc /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n"
    root = tree(tmp_path, {"proc/self/mountinfo": mounts, "proc/self/cgroup": "4:memory:/docker/abc\n", **host(),
                           f"{M1}/memory.limit_in_bytes": f"{GIB}\n", f"{M1}/memory.usage_in_bytes": "0\n"})
    found = read_limits(root, affinity=2)
    assert found.memory is not None and found.memory.source == f"{root}/{M1}/memory.limit_in_bytes"


def test_escaped_mount_points_are_read(tmp_path):
    mounts = r"40 31 0:32 / /sys/fs/my\040cgroup rw - cgroup2 cgroup2 rw" + "\n"
    root = tree(tmp_path, {"proc/self/mountinfo": mounts, "proc/self/cgroup": "0::/\n", **host(),
                           "sys/fs/my cgroup/memory.max": f"{GIB}\n", "sys/fs/my cgroup/memory.current": "0\n"})
    assert read_limits(root, affinity=2).memory_room == GIB


@pytest.mark.parametrize("text", ["", "garbage\n", "-5\n", "max\n"])
def test_odd_files_read_as_no_limit(tmp_path, text):
    root = v2(tmp_path, {f"{V2}/job/step/memory.max": text, f"{V2}/job/step/memory.current": "10\n",
                         f"{V2}/job/step/cpu.max": text})
    found = read_limits(root, affinity=2)
    assert found.memory is None and found.memory_room is None and found.cpus == 2


def test_nothing_readable_gives_no_limits(tmp_path):
    found = read_limits(str(tmp_path), affinity=5)
    assert found == Limits(affinity=5)
    assert found.available_memory is None and found.total_memory is None and found.cpus == 5


def test_this_process_is_read_without_error():
    found = read_limits()
    assert found.cpus >= 1
    assert found.available_memory is None or found.available_memory >= 0


def test_sizes_are_short():
    assert [gib(v) for v in (1.4 * GIB, 300 * MIB, 12 * 1024, 5, 20 * GIB)] == [
        "1.4 GiB", "300 MiB", "12 KiB", "5 B", "20 GiB"]


def test_the_unescaping_of_mount_points():
    assert limits._unescape(r"/a\040b\011c\134d") == "/a b\tc\\d"
