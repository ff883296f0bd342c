"""Starts a local JAX cluster: one Python process per host, joined on a free port.

Each process runs ``script`` with ``--process-id I --processes N --port P --out FILE``
and the extra arguments given, on CPU devices (``XLA_FLAGS`` dropped, so a caller's
forced device count does not leak in), and writes its report as JSON to ``FILE``.
:func:`finish` waits for all of them, kills the rest if one hangs, and reads the reports.

Example:
    >>> reports = finish(start(SCRIPT, 2, tmp_path, "run", "--batch", "6"))  # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO_ROOT

ROOT = REPO_ROOT
TIMEOUT_S = 120

Started = list[tuple[subprocess.Popen, str]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(script: str, hosts: int, out_dir: Path, tag: str, *extra: str) -> Started:
    """Starts ``hosts`` processes of ``script``; returns (process, report path) pairs."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
    env.pop("XLA_FLAGS", None)
    port, started = free_port(), []
    for i in range(hosts):
        out = str(out_dir / f"{tag}_{i}.json")
        args = ["--process-id", str(i), "--processes", str(hosts), "--port", str(port), "--out", out, *extra]
        proc = subprocess.Popen([sys.executable, script, *args], env=env, cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        started.append((proc, out))
    return started


def finish(started: Started, timeout: float = TIMEOUT_S) -> list[dict]:
    """Waits for every process (killing all on a hang), checks they succeeded, reads their reports."""
    logs = []
    try:
        for proc, _ in started:
            logs.append(proc.communicate(timeout=timeout)[0])
    finally:
        for proc, _ in started:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    for (proc, _), log in zip(started, logs):
        assert proc.returncode == 0, f"a JAX process failed:\n{log[-3000:]}"
    reports = []
    for _, out in started:
        with open(out) as f:
            reports.append(json.load(f))
    return reports
