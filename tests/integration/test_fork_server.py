"""Workers forked by the pool's fork server: fast, safe, and never required."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import dataloader as dl
from dataloader.engine.pool import zygote as fork_server
from dataloader.engine.pool.process import worker_env
from tests.integration import workers_pipelines as wp
from tests.integration.conftest import child_pids, wait_until

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def loader(n=400, workers=2, slow=False, **kwargs):
    slowly = [dl.MapTransform(wp.slow_identity)] if slow else []
    return dl.DataLoader(
        dl.RangeDataSource(n), dl.IndexSampler(n, shuffle=True, seed=3, num_epochs=1),
        [*slowly, dl.MapTransform(wp.to_array), dl.Batch(8)], worker_count=workers, **kwargs)


def reference(n=400):
    return [b["id"].tolist() for b in loader(n, workers=0)]


def test_workers_are_children_of_the_fork_server_and_it_stops_with_the_pool():
    it = iter(loader())
    next(it)
    executor = it._executor
    server = executor._workers.zygote
    assert server is not None and server.alive
    assert wait_until(lambda: all(w.ready for w in executor._workers.workers), 10) or [next(it) for _ in range(5)]
    assert {parent_of(pid) for pid in executor.pids} == {server.proc.pid}
    assert parent_of(server.proc.pid) == os.getpid()
    it.close()
    assert server.proc.poll() is not None
    assert not child_pids()


def test_a_killed_fork_server_changes_no_batch_and_workers_start_without_it():
    expected = reference(1000)
    it = iter(loader(1000, slow=True))  # 2 ms a record: ~1 s of work for 2 workers
    got = [next(it)["id"].tolist() for _ in range(5)]
    executor = it._executor
    server = executor._workers.zygote
    forked = set(executor.pids)
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait()
    # Its workers notice their parent is gone and exit; the pool replaces them with
    # interpreters of its own, children of this process.
    got += [b["id"].tolist() for b in it]
    assert got == expected
    assert executor._workers.zygote is None
    assert not forked & set(executor.pids)


def test_a_fork_server_that_cannot_fork_safely_is_not_used(tmp_path, monkeypatch):
    """A preloaded module that starts a thread makes forking unsafe: the zygote refuses,
    and the workers start as interpreters; the batches do not change."""
    (tmp_path / "threaded_module.py").write_text(
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(fork_server, "BASE_MODULES", (*fork_server.BASE_MODULES, "threaded_module"))
    expected = reference()
    it = iter(loader(warm_start=False))  # every unit in a worker, not this process
    got = [b["id"].tolist() for b in it]
    assert got == expected
    assert it._executor._workers.zygote is None


def test_forked_workers_do_not_share_numpy_global_random_state():
    ld = dl.DataLoader(
        dl.RangeDataSource(64), dl.SequentialSampler(64),
        [dl.MapTransform(wp.numpy_draw), dl.Batch(4, batch_fn=list)], worker_count=3,
        warm_start=False,
    )
    first_draw_per_worker = {}
    for batch in ld:
        first_draw_per_worker.setdefault(batch[0]["pid"], batch[0]["draw"])
    draws = list(first_draw_per_worker.values())
    assert len(draws) >= 2 and len(set(draws)) == len(draws)


def test_fork_server_can_be_switched_off():
    script = textwrap.dedent(
        """
        import os, dataloader as dl
        from tests.integration import workers_pipelines as wp
        ld = dl.DataLoader(dl.RangeDataSource(64), dl.SequentialSampler(64),
                           [dl.MapTransform(wp.to_array), dl.Batch(8)], worker_count=2)
        it = iter(ld)
        first = next(it)
        assert it._executor._workers.zygote is None and len(it._executor.pids) == 2
        ids = [first["id"].tolist()] + [b["id"].tolist() for b in it]
        assert ids == [list(range(i, i + 8)) for i in range(0, 64, 8)], ids
        print("ok", flush=True)
        """
    )
    env = dict(os.environ, GRANARY_FORK_SERVER="0")
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=100)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_preload_names_the_engine_and_the_plans_safe_modules_only():
    ld = loader()
    modules = fork_server.preload_modules(ld._plan_bytes)
    assert modules[: len(fork_server.BASE_MODULES)] == list(fork_server.BASE_MODULES)
    assert "numpy" in modules
    # The user's module is imported by each worker after the fork, never by the zygote.
    assert "tests.integration.workers_pipelines" not in modules
    assert all(m.split(".")[0] in fork_server.PRELOADABLE for m in modules)
    assert len(modules) == len(set(modules))


def test_a_fork_server_reaps_what_it_forked_with_exit_codes():
    server = fork_server.Zygote(list(fork_server.BASE_MODULES), "granary_test_none_",
                                os.sched_getaffinity(0), worker_env(), "")
    try:
        read_task, write_task = os.pipe()
        read_result, write_result = os.pipe()
        child = server.fork((read_task, write_result))
        os.close(read_task)
        os.close(write_result)
        assert child.pid > 0 and parent_of(child.pid) == server.proc.pid
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(0.05)  # waiting for its init message: alive
        child.kill()
        assert child.wait(5) == -signal.SIGKILL
        os.close(write_task)
        os.close(read_result)
    finally:
        server.close()
    assert server.proc.returncode == 0
    assert np.all([not os.path.exists(f"/proc/{child.pid}")])
