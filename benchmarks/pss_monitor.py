"""Samples the summed PSS of a process tree until told to stop; reports the peak.

Runs as its own process (``python pss_monitor.py ROOT_PID INTERVAL_S``) so that
sampling neither takes the measured process's GIL nor counts as its CPU time.
It prints ``ready`` after the first sample, then samples every INTERVAL_S
seconds until a line (or EOF) arrives on stdin, then prints the peak in bytes.
Its own process is left out of the sum even though it is in the tree.
"""

from __future__ import annotations

import contextlib
import os
import select
import sys

import psutil


def _pss_bytes(pid: int) -> int:
    """PSS of one process from ``/proc/PID/smaps_rollup``.

    The kernel sums it for us; psutil's ``memory_full_info`` parses the whole
    ``smaps`` instead, which cost ~14% of a core at a 50 ms interval and so slowed
    exactly the rows that keep both cores busy (the multi-worker ones).
    """
    with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
        for line in f:
            if line.startswith(b"Pss:"):
                return int(line.split()[1]) * 1024
    return 0


def tree_pss(root: psutil.Process, exclude: int) -> int:
    """Sum of PSS over ``root`` and its descendants, less the process ``exclude``."""
    total = 0
    try:
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    for process in processes:
        if process.pid == exclude:
            continue
        # A worker may exit between listing and reading.
        with contextlib.suppress(OSError):
            total += _pss_bytes(process.pid)
    return total


def main(argv: list[str]) -> int:
    root = psutil.Process(int(argv[1]))
    interval = float(argv[2]) if len(argv) > 2 else 0.05
    me = os.getpid()
    peak = tree_pss(root, me)
    print("ready", flush=True)
    while True:
        ready, _, _ = select.select([sys.stdin], [], [], interval)
        peak = max(peak, tree_pss(root, me))
        if ready:
            break
    print(peak, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
