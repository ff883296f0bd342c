"""Multi-process tests check afterwards that no child process and no block is left."""

from __future__ import annotations

import gc
import os

import pytest

from tests.helpers import wait_until


def child_pids(pid: int | None = None) -> set[int]:
    """Live (non-zombie) descendants of ``pid`` (default: this process), from /proc:
    its children and theirs (workers are children of the process's fork server). This
    process's fork server itself is not counted: it outlives pools by design (its
    children, the workers, are)."""
    from dataloader.engine.pool.zygote import server_pid

    server = server_pid() if pid is None else None
    pid = os.getpid() if pid is None else pid
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            parents[int(entry)] = int(fields[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found - {server}


def _owner_alive_elsewhere(name: str) -> bool:
    """A block of a live process that is neither this one nor one of its children (another
    program on the machine): not this test's to clean up."""
    pid = name[len("granary_"):].split("_", 1)[0]
    if not pid.isdigit() or int(pid) == os.getpid() or int(pid) in child_pids():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def shm_blocks() -> set[str]:
    """granary's blocks in /dev/shm, but those of unrelated live processes."""
    return {
        n for n in os.listdir("/dev/shm")
        if n.startswith("granary_") and not _owner_alive_elsewhere(n)
    }


@pytest.fixture(autouse=True)
def no_leaks():
    """Fails a test that leaves a worker process or a shared-memory block behind."""
    children_before, blocks_before = child_pids(), shm_blocks()
    yield
    gc.collect()
    assert wait_until(lambda: child_pids() <= children_before), (
        f"child processes left behind: {child_pids() - children_before}"
    )
    assert wait_until(lambda: shm_blocks() <= blocks_before), (
        f"shared-memory blocks left behind: {shm_blocks() - blocks_before}"
    )
