"""Starting a worker process: the error when the container's limits refuse one."""

from __future__ import annotations

import pytest

from dataloader.engine.pool import process
from dataloader.errors import WorkerError


def test_a_start_refused_under_a_pids_limit_names_the_limit_and_what_to_do(monkeypatch):
    monkeypatch.setattr(process, "pids_limit", lambda: (64, 63, "/sys/fs/cgroup/pids/job/pids.max"))
    error = process.start_failure(3, "fork() failed: [Errno 11] Resource temporarily unavailable")
    assert isinstance(error, WorkerError)
    assert str(error) == (
        "could not start worker 3: the pids limit of this container is reached (pids.max=64 in "
        "/sys/fs/cgroup/pids/job/pids.max, 63 in use; threads count too): fork() failed: [Errno 11] "
        "Resource temporarily unavailable; lower worker_count (worker_count='auto' keeps within it), or "
        "raise the limit (docker run --pids-limit, the pod's pids limit)"
    )


def test_a_start_refused_without_a_pids_limit_says_what_else_limits_processes(monkeypatch):
    monkeypatch.setattr(process, "pids_limit", lambda: None)
    with pytest.raises(WorkerError, match=r"could not start worker 0: can't start new thread; .*ulimit -u"):
        raise process.start_failure(0, "can't start new thread")


def test_the_pids_limit_is_the_tightest_along_the_control_group_path(tmp_path, monkeypatch):
    """v1 layout: a limit on the job's group binds the step's group below it."""
    top = tmp_path / "pids"
    for folder, most, current in [("job", "10", "7"), ("job/step", "max", "3")]:
        (top / folder).mkdir(parents=True)
        (top / folder / "pids.max").write_text(most + "\n")
        (top / folder / "pids.current").write_text(current + "\n")
    cgroup = tmp_path / "cgroup"
    cgroup.write_text("4:memory:/job/step\n8:pids:/job/step\n")
    real_open = open

    def fake_open(path, *args, **kwargs):
        path = str(path)
        if path == "/proc/self/cgroup":
            return real_open(cgroup, *args, **kwargs)
        if path.startswith("/sys/fs/cgroup/pids"):
            return real_open(str(top) + path[len("/sys/fs/cgroup/pids"):], *args, **kwargs)
        raise FileNotFoundError(path)

    monkeypatch.setattr("builtins.open", fake_open)
    assert process.pids_limit() == (10, 7, "/sys/fs/cgroup/pids/job/pids.max")
