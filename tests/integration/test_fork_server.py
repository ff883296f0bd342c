"""Workers forked by the pool's fork server: fast, safe, and never required."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import dataloader as dl
from dataloader.engine.pool import zygote as fork_server
from dataloader.engine.pool.process import worker_env
from dataloader.errors import WorkerError
from tests.helpers import python_script
from tests.integration import workers_pipelines as wp
from tests.integration.conftest import child_pids, wait_until

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def fresh_server(monkeypatch):
    """A test that changes what the fork server imports gets a server of its own, and
    leaves none behind for the next test."""
    fork_server.shutdown()
    yield monkeypatch
    monkeypatch.undo()
    fork_server.shutdown()


def write_module(folder, name, text):
    (folder / f"{name}.py").write_text(textwrap.dedent(text))


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


def test_workers_are_children_of_the_fork_server_which_outlives_the_pool():
    before = child_pids()  # what earlier tests keep (multiprocessing's resource tracker)
    it = iter(loader())
    next(it)
    executor = it._executor
    server = executor._workers.zygote
    assert server is not None and server.alive and server.proc.pid == fork_server.server_pid()
    assert wait_until(lambda: all(w.ready for w in executor._workers.workers), 10) or [next(it) for _ in range(5)]
    assert {parent_of(pid) for pid in executor.pids} == {server.proc.pid}
    assert parent_of(server.proc.pid) == os.getpid()
    workers = executor.pids
    it.close()
    # The pool's workers are gone; the server stays for the next pool of this process.
    assert wait_until(lambda: not any(os.path.exists(f"/proc/{p}") for p in workers))
    assert server.proc.poll() is None and server.alive
    assert child_pids() <= before


def test_one_server_serves_every_loader_and_iterator_of_the_process():
    """Train and eval loaders, each iterated twice: every worker is a child of the one
    server, which was running before the second loader was even built."""
    train = loader()
    server = fork_server.server_pid()
    assert server is not None  # started by the loader's construction, before any iter()
    evaluation = dl.DataLoader(
        dl.RangeDataSource(64), dl.SequentialSampler(64),
        [dl.MapTransform(wp.to_array), dl.Batch(8)], worker_count=3)
    parents = set()
    for ld in (train, evaluation, train, evaluation):
        it = iter(ld)
        next(it)
        parents |= {parent_of(pid) for pid in it._executor.pids}
        assert it._executor._workers.zygote.proc.pid == server
        it.close()
    assert parents == {server} and fork_server.server_pid() == server
    assert [b["id"].tolist() for b in iter(train)] == reference()
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
    # The next pool gets a new server.
    it = iter(loader(64))
    next(it)
    assert it._executor._workers.zygote.proc.pid not in (None, server.proc.pid)
    it.close()


@pytest.mark.timeout(60)  # were it to wait ANSWER_WAIT_S (60 s) for the answer, it would fail
def test_a_stopped_fork_server_is_left_behind_quickly_and_changes_no_batch():
    """SIGSTOP on the server: it cannot reap nor fork. A worker that dies must be
    replaced; the pool finds the server stopped, kills it and starts an interpreter."""
    expected = reference(1000)
    it = iter(loader(1000, slow=True))
    got = [next(it)["id"].tolist() for _ in range(3)]
    executor = it._executor
    server = executor._workers.zygote
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        os.kill(executor.pids[0], signal.SIGKILL)
        got += [b["id"].tolist() for b in it]
    finally:
        with contextlib.suppress(ProcessLookupError):  # killed and reaped already
            os.kill(server.proc.pid, signal.SIGCONT)
    assert got == expected
    assert executor._workers.zygote is None and not server.alive
    assert server.proc.wait(10) == -signal.SIGKILL


def test_a_fork_server_that_cannot_fork_safely_is_not_used(tmp_path, fresh_server):
    """A preloaded module that starts a thread makes forking unsafe: the server refuses,
    and the workers start as interpreters; the batches do not change."""
    write_module(tmp_path, "threaded_module", """
        import threading, time
        threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
        """)
    fresh_server.syspath_prepend(str(tmp_path))
    fresh_server.setattr(fork_server, "BASE_MODULES", (*fork_server.BASE_MODULES, "threaded_module"))
    expected = reference()
    it = iter(loader())
    got = [b["id"].tolist() for b in it]
    assert got == expected
    assert it._executor._workers.zygote is None


def test_a_plan_module_that_starts_a_thread_is_named_and_left_out_of_the_next_server(tmp_path, fresh_server, caplog):
    """The server imports the modules of the plan's objects; one that starts a thread on
    import makes it unable to fork: it says which, this pool starts interpreters, and the
    next pool gets a server without that module, which forks its workers."""
    write_module(tmp_path, "starts_a_thread", """
        import threading, time
        threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()

        def double(x):
            return {"id": x * 2}
        """)
    fresh_server.syspath_prepend(str(tmp_path))
    threaded_before = set(fork_server.THREADED)  # a process-wide record: put back after
    try:
        check_a_threaded_module_is_left_out(threaded_before, caplog)
    finally:
        fork_server.THREADED.intersection_update(threaded_before)


def check_a_threaded_module_is_left_out(threaded_before, caplog):
    import starts_a_thread

    def threaded_loader():
        return dl.DataLoader(dl.RangeDataSource(40), dl.SequentialSampler(40),
                             [dl.MapTransform(starts_a_thread.double), dl.Batch(8)], worker_count=2)

    assert "starts_a_thread" in fork_server.preload_modules(threaded_loader()._plan_bytes)
    with caplog.at_level("WARNING", logger="dataloader"):
        first = [b["id"].tolist() for b in threaded_loader()]
    assert first == [[2 * x for x in range(i, i + 8)] for i in range(0, 40, 8)]
    assert fork_server.THREADED - threaded_before == {"starts_a_thread"}
    assert any("importing starts_a_thread started a thread in the fork server" in r.getMessage()
               for r in caplog.records)
    ld = threaded_loader()
    assert "starts_a_thread" not in fork_server.preload_modules(ld._plan_bytes)
    it = iter(ld)
    assert next(it)["id"].tolist() == list(range(0, 16, 2))
    server = fork_server.server_pid()
    assert server is not None
    assert {parent_of(pid) for pid in it._executor.pids} == {server}
    it.close()


def test_forked_workers_do_not_share_numpy_global_random_state(tmp_path):
    """Each worker draws from numpy's global generator as it starts (every worker runs
    its init, whichever units it gets): no two draw the same."""
    folder = str(tmp_path)

    def draw(index, count):
        with open(f"{folder}/{index}", "w") as f:
            f.write(str(np.random.randint(2**62)))

    ld = dl.DataLoader(
        dl.RangeDataSource(64), dl.SequentialSampler(64),
        [dl.MapTransform(wp.to_array), dl.Batch(4)], worker_count=3, worker_init_fn=draw,
    )
    it = iter(ld)
    next(it)
    assert wait_until(lambda: len(os.listdir(folder)) == 3)
    it.close()
    draws = [(tmp_path / name).read_text() for name in os.listdir(folder)]
    assert len(set(draws)) == 3, draws


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


def test_preload_names_the_engine_and_the_modules_the_plans_objects_come_from():
    ld = loader(slow=True)
    modules = fork_server.preload_modules(ld._plan_bytes)
    assert modules[: len(fork_server.BASE_MODULES)] == list(fork_server.BASE_MODULES)
    assert "numpy" in modules
    assert "dataloader.operations.transforms" in modules  # MapTransform's module
    # The user's module (its functions are the plan's): imported once, in the server.
    assert "tests.integration.workers_pipelines" in modules
    assert "__main__" not in modules
    assert not any(m.split(".")[0] in fork_server.NEVER_PRELOAD for m in modules)
    assert len(modules) == len(set(modules))


def test_a_module_that_started_a_thread_in_the_server_is_left_out_of_the_next_one(monkeypatch):
    monkeypatch.setattr(fork_server, "THREADED", {"dataloader"})
    modules = fork_server.preload_modules(loader()._plan_bytes)
    assert not any(m.startswith("dataloader.operations") for m in modules)
    assert "numpy" in modules


def test_a_fork_server_reaps_what_it_forked_with_exit_codes():
    server = fork_server.Zygote(worker_env(), "")
    try:
        pool = server.open_pool(fork_server.BASE_MODULES)
        read_task, write_task = os.pipe()
        read_result, write_result = os.pipe()
        child = server.fork((read_task, write_result), pool, os.sched_getaffinity(0))
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


def test_a_fork_that_fails_in_the_server_is_a_clear_error_and_the_server_lives_on(tmp_path, fresh_server):
    """fork() failing with EAGAIN (what a pids limit gives) in the server: the server
    answers instead of dying, and the loader raises an error that says what to do."""
    write_module(tmp_path, "no_fork", """
        import errno, os
        def refuse():
            raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
        os.fork = refuse
        """)
    fresh_server.syspath_prepend(str(tmp_path))
    fresh_server.setattr(fork_server, "BASE_MODULES", (*fork_server.BASE_MODULES, "no_fork"))
    ld = loader()
    server = fork_server.shared()
    with pytest.raises(WorkerError, match=r"could not start worker \d: .*fork\(\) failed: .*Resource "
                       r"temporarily unavailable.*lower worker_count"):
        next(iter(ld))
    assert server.alive and server.proc.poll() is None


def test_a_script_that_never_closes_its_loaders_exits_with_no_process_left():
    script = """
        import dataloader as dl
        from dataloader.engine.pool import zygote
        from tests.integration import workers_pipelines as wp
        loaders = [dl.DataLoader(dl.RangeDataSource(400), dl.SequentialSampler(400),
                                 [dl.MapTransform(wp.to_array), dl.Batch(8)], worker_count=2)
                   for _ in range(2)]
        its = [iter(ld) for ld in loaders]
        for it in its:
            next(it)
        pids = [zygote.server_pid()] + [p for it in its for p in it._executor.pids]
        print(" ".join(map(str, pids)), flush=True)
        """
    with python_script(script) as proc:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 5
        assert proc.wait(60) == 0, proc.stderr.read()
        # Inside the block: its end kills the script's whole group, leftovers too.
        assert wait_until(lambda: not any(os.path.exists(f"/proc/{p}") for p in pids))


def test_the_fork_server_and_its_workers_end_with_a_sigkilled_training_process():
    script = """
        import time, dataloader as dl
        from dataloader.engine.pool import zygote
        from tests.integration import workers_pipelines as wp
        ld = dl.DataLoader(dl.RangeDataSource(400), dl.SequentialSampler(400),
                           [dl.MapTransform(wp.to_array), dl.Batch(8)], worker_count=2)
        it = iter(ld)
        next(it)
        print(zygote.server_pid(), *it._executor.pids, flush=True)
        time.sleep(600)
        """
    with python_script(script) as proc:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 3
        proc.kill()  # the training process only
        proc.wait()
        assert wait_until(lambda: not any(os.path.exists(f"/proc/{p}") for p in pids))


@contextlib.contextmanager
def pids_cgroup(limit):
    """A new control group whose ``pids.max`` is ``limit`` (cgroup v1 or v2); skips the
    test where this process may not make one (not root, no pids controller)."""
    name = f"granary_test_{os.getpid()}_{os.urandom(3).hex()}"
    for top in ("/sys/fs/cgroup/pids", "/sys/fs/cgroup"):
        folder = os.path.join(top, name)
        try:
            os.mkdir(folder)
        except OSError:
            continue
        if os.path.exists(os.path.join(folder, "pids.max")):
            break
        os.rmdir(folder)
    else:
        pytest.skip("no pids control group can be made here (needs root and the pids controller)")
    try:
        with open(os.path.join(folder, "pids.max"), "w") as f:
            f.write(str(limit))
        yield folder
    finally:
        wait_until(lambda: _try_rmdir(folder), 30)


def _try_rmdir(folder):
    try:
        os.rmdir(folder)
    except OSError:
        return False
    return True


def test_a_pids_limit_that_stops_workers_from_starting_is_named():
    """In a container that allows 6 tasks (threads count), 8 workers cannot start: however
    it shows (fork() refused in the server, no thread in this process or in a worker),
    the error names the limit, and nothing hangs."""
    with pids_cgroup(6) as folder:
        script = f"""
            import os
            with open({os.path.join(folder, "cgroup.procs")!r}, "w") as f:
                f.write(str(os.getpid()))
            import dataloader as dl
            from tests.integration import workers_pipelines as wp
            ld = dl.DataLoader(dl.RangeDataSource(400), dl.SequentialSampler(400),
                               [dl.MapTransform(wp.to_array), dl.Batch(8)], worker_count=8)
            try:
                list(ld)
            except dl.WorkerError as exc:
                print("error:", exc, flush=True)
            """
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        with python_script(script, env=env) as proc:
            out, err = proc.communicate(timeout=100)
    assert proc.returncode == 0, err
    assert re.search(r"error: .*pids\.max=6", out), (out, err)


@pytest.mark.timeout(60)
def test_a_server_stopped_before_iter_is_left_behind_and_workers_start_as_interpreters():
    """Fork requests sent to a stopped server are never answered and their pipes never
    close: the pool looks at the server while its workers are not ready."""
    expected = reference(64)
    ld = loader(64)
    server = fork_server.shared()
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        it = iter(ld)
        got = [next(it)["id"].tolist()]
        parents = {parent_of(pid) for pid in it._executor.pids}
        got += [b["id"].tolist() for b in it]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server.proc.pid, signal.SIGCONT)
    assert got == expected
    assert not server.alive and it._executor._workers.zygote is None
    assert parents == {os.getpid()}  # interpreters, started by this process


def read_variables(x):
    return {"x": x, "seen": (os.environ.get("GRANARY_TEST_SETTING", "unset"), os.environ.get("A_TEST_VARIABLE", "unset"))}


def test_the_workers_see_the_environment_of_iter_and_a_changed_import_setting_gets_a_new_server(monkeypatch):
    """Workers get the environment of the training process when their pool opens; a
    setting the server's imports read (GRANARY_*, PYTHON*, thread counts...) or sys.path
    changed since the server started needs a new server, the old one ending with its
    last pool."""

    def seen():
        ld = dl.DataLoader(dl.RangeDataSource(16), dl.SequentialSampler(16),
                           [dl.MapTransform(read_variables), dl.Batch(4, batch_fn=list)], worker_count=2)
        with iter(ld) as it:
            return {e["seen"] for b in it for e in b}, fork_server.server_pid()

    before, first = seen()
    monkeypatch.setenv("A_TEST_VARIABLE", "set after the server started")
    after, same = seen()
    assert before == {("unset", "unset")} and after == {("unset", "set after the server started")}
    assert same == first  # an ordinary variable: the same server
    monkeypatch.setenv("GRANARY_TEST_SETTING", "set")
    last, other = seen()
    assert last == {("set", "set after the server started")}
    assert first is not None and other not in (None, first)
    assert not os.path.exists(f"/proc/{first}")  # the old one ended (its pools were done)


def test_a_training_process_with_more_than_1024_open_files_keeps_its_fork_server():
    """A mixture of ~1,000 files, or many sockets, puts the fork server's socket beyond
    descriptor 1024 (``pass_fds`` keeps its number): ``select()`` cannot wait on it. Its
    workers must still be forked by it, with no warning."""
    script = """
        import json, logging, os, resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < 4096:
            resource.setrlimit(resource.RLIMIT_NOFILE, (4096 if hard == resource.RLIM_INFINITY else min(4096, hard), hard))
        held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
        said = []
        class Keep(logging.Handler):
            def emit(self, record):
                said.append(record.getMessage())
        logging.getLogger("dataloader").addHandler(Keep(logging.WARNING))
        import dataloader as dl
        from dataloader.engine.pool import zygote
        from tests.integration import workers_pipelines as wp
        ld = dl.DataLoader(dl.RangeDataSource(400), dl.SequentialSampler(400),
                           [dl.MapTransform(wp.to_array), dl.Batch(8)], worker_count=2)
        it = iter(ld)
        got = [next(it)["id"].tolist()]
        server, workers = zygote.server_pid(), list(it._executor.pids)
        def parent(pid):
            with open(f"/proc/{pid}/stat") as f:
                return int(f.read().rsplit(")", 1)[1].split()[1])
        parents = {parent(pid) for pid in workers}
        got += [b["id"].tolist() for b in it]
        print(json.dumps({"highest": max(held), "server": server, "parents": sorted(parents),
                          "server_after": zygote.server_pid(), "said": said,
                          "right": got == [list(range(i, i + 8)) for i in range(0, 400, 8)]}))
        """
    with python_script(script) as proc:
        assert proc.wait(90) == 0, proc.stderr.read()
        out = json.loads(proc.stdout.read())
    assert out["highest"] > 1024
    assert out["parents"] == [out["server"]], f"workers started as interpreters: {out}"
    assert out["server_after"] == out["server"] and out["right"]
    assert out["said"] == []


def zombie_children() -> set[int]:
    """This process's children that exited and were never reaped (state ``Z``)."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError):
                with open(f"/proc/{entry}/stat") as f:
                    state, parent = f.read().rsplit(")", 1)[1].split()[:2]
                if state == "Z" and int(parent) == os.getpid():
                    found.add(int(entry))
    return found


def test_a_fork_server_that_died_is_reaped_by_the_pool_that_noticed_and_when_idle():
    """Not left a zombie child of the training process until its exit (nor until the next
    pool happens to replace it): reaped by the pool that finds it dead, by close() at the
    latest, or, dying between pools, as soon as its socket closes."""
    expected = reference(1000)
    it = iter(loader(1000, slow=True))
    got = [next(it)["id"].tolist()]
    server = it._executor._workers.zygote
    os.kill(server.proc.pid, signal.SIGKILL)  # not waited for here: the loader must
    got += [b["id"].tolist() for b in it]
    it.close()
    assert got == expected
    assert not server.alive
    assert server.proc.pid not in zombie_children()
    # Between pools: the next server dies while no pool uses it.
    it = iter(loader(64))
    next(it)
    it.close()
    idle = fork_server.server_pid()
    assert idle is not None and idle != server.proc.pid
    os.kill(idle, signal.SIGKILL)
    assert wait_until(lambda: fork_server.server_pid() is None)  # its loss was noticed
    assert wait_until(lambda: idle not in zombie_children()), f"fork server {idle} is a zombie"
