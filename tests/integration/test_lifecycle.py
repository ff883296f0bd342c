"""Every way a loader's life can end leaves no child process and no shared memory."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import dataloader as dl
from tests.helpers import PATIENCE_S, REPO_ROOT, python_script
from tests.integration import workers_pipelines as wp
from tests.integration.conftest import child_pids, shm_blocks, wait_until

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(180)]

ROOT = REPO_ROOT


def make_loader(workers=2, n=10_000):
    return dl.DataLoader(
        dl.RangeDataSource(n), dl.IndexSampler(n, shuffle=True, seed=0),
        [dl.MapTransform(wp.to_array), dl.Batch(16)], worker_count=workers,
    )


def test_fifty_cycles_of_create_iterate_break_collect_leave_nothing():
    loader = make_loader()
    for cycle in range(50):
        for i, _ in enumerate(loader):
            if i == cycle % 3:
                break
        gc.collect()
    # The autouse fixture checks children and blocks; check here too, to name the test.
    assert wait_until(lambda: not child_pids())
    assert wait_until(lambda: not shm_blocks())


def test_close_does_not_wait_for_a_busy_worker():
    """A worker stuck in user code for ten minutes: close() stops it rather than waiting
    (were it to wait, the test's timeout would end it first)."""
    loader = dl.DataLoader(
        dl.RangeDataSource(1000), dl.SequentialSampler(1000),
        [dl.MapTransform(wp.hang_on(13)), dl.Batch(4)], worker_count=2, warm_start=False,
    )
    it = iter(loader)
    assert next(it).tolist() == [0, 1, 2, 3]
    pids = it._executor.pids
    it.close()
    assert wait_until(lambda: not any(os.path.exists(f"/proc/{p}") for p in pids))


def test_exception_in_the_training_loop_cleans_up():
    def train():
        for _ in make_loader():
            raise RuntimeError("training failed")

    with pytest.raises(RuntimeError, match="training failed"):
        train()
    gc.collect()
    assert wait_until(lambda: not child_pids())


def _maps_result_blocks(pid: int) -> bool:
    """Whether process ``pid`` maps a pool's result block (a memfd, named only there)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return "memfd:granary-result" in f.read()
    except OSError:
        return False


_TRAINER = """
    import os, sys, dataloader as dl
    from tests.integration import workers_pipelines as wp
    loader = dl.DataLoader(dl.RangeDataSource(100000), dl.IndexSampler(100000, shuffle=True, seed=0),
                           [dl.MapTransform(wp.to_array), dl.Batch(16)], worker_count=2,
                           warm_start=False)  # every unit in a worker, through a block
    it = iter(loader)
    for _ in range(20):
        next(it)
    def maps_blocks(pid):
        with open(f"/proc/{pid}/maps") as f:
            return "memfd:granary-result" in f.read()
    # On a busy machine one worker may have done every unit so far: go on until each
    # has sent a result (a block), which is what the tests look at.
    while not all(maps_blocks(p) for p in it._executor.pids):
        next(it)
    print(" ".join(map(str, it._executor.pids)), flush=True)
    print(len(it._executor._workers.transport.blocks), flush=True)
    import time; time.sleep(600)
    """


def _uses_dev_shm(pid: int) -> bool:
    """Whether process ``pid`` maps a file of /dev/shm (a named block)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return "/dev/shm/" in f.read()
    except OSError:
        return False


def _named_after(pids) -> set[str]:
    """The /dev/shm entries named after one of ``pids``, as named blocks were. Other
    programs on the machine add and remove entries there meanwhile (Python's psm_
    blocks, other test runs): a test compares only what its own job could have made."""
    return {n for n in os.listdir("/dev/shm") if any(n.startswith(f"granary_{p}_") for p in pids)}


def test_sigkilled_parent_leaves_no_children_and_no_blocks():
    with python_script(_TRAINER) as proc:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2 and int(proc.stdout.readline()) > 0
        family = child_pids(proc.pid) | {proc.pid}
        # The blocks have no name: the workers map them, /dev/shm does not hold them.
        assert all(_maps_result_blocks(p) for p in pids)
        assert not any(_uses_dev_shm(p) for p in family) and not _named_after(family)
        proc.kill()  # the trainer only: its workers must notice by themselves
        proc.wait()
        assert wait_until(lambda: not any(os.path.exists(f"/proc/{p}") for p in pids))
    assert not _named_after(family)


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_killing_the_whole_process_group_leaves_no_process_and_no_block(signum):
    # What SLURM, Kubernetes, systemd and `timeout` do: the trainer, the fork server and
    # the workers get the signal at once, so nobody is left to clean up after the others.
    with python_script(_TRAINER) as proc:
        workers = [int(p) for p in proc.stdout.readline().split()]
        assert int(proc.stdout.readline()) > 0
        family = child_pids(proc.pid) | {proc.pid}
        assert set(workers) <= family and all(_maps_result_blocks(p) for p in workers)
        assert not any(_uses_dev_shm(p) for p in family)
        os.killpg(proc.pid, signum)
        proc.wait()
        assert wait_until(lambda: not any(os.path.exists(f"/proc/{p}") for p in family))
    assert not _named_after(family)


def test_a_pool_never_removes_another_jobs_block():
    # Another job's block, named as this project's named blocks were, after a pid that
    # does not run here: in another PID namespace sharing /dev/shm it may be in use.
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert not os.path.exists(f"/proc/{gone.pid}")
    foreign = [f"/dev/shm/granary_{gone.pid}_{os.urandom(4).hex()}_0", f"/dev/shm/granary_{gone.pid}_src_{os.urandom(4).hex()}"]
    for path in foreign:
        with open(path, "wb") as f:
            f.write(b"another job's data")
    try:
        it = iter(make_loader(n=64))
        next(it)
        it.close()
        for path in foreign:
            with open(path, "rb") as f:
                assert f.read() == b"another job's data"
    finally:
        for path in foreign:
            os.unlink(path)


def test_ctrl_c_ends_the_training_process_and_its_workers():
    with python_script(
        """
        import dataloader as dl
        from tests.integration import workers_pipelines as wp
        loader = dl.DataLoader(dl.RangeDataSource(10**6), dl.IndexSampler(10**6, shuffle=True, seed=0),
                               [dl.MapTransform(wp.slow_identity), dl.Batch(16)], worker_count=2)
        it = iter(loader)
        next(it); next(it)
        print(" ".join(map(str, it._executor.pids)), flush=True)
        for batch in it:
            pass
        """
    ) as proc:
        pids = [int(p) for p in proc.stdout.readline().split()]
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole group
        _, err = proc.communicate(timeout=PATIENCE_S)
        assert "KeyboardInterrupt" in err, err
        assert wait_until(lambda: not any(os.path.exists(f"/proc/{p}") for p in pids))
        assert not {b for b in shm_blocks() if b.startswith(f"granary_{proc.pid}_")}


def test_interpreter_exit_without_close_stops_the_workers():
    with python_script(
        """
        import dataloader as dl
        from tests.integration import workers_pipelines as wp
        loader = dl.DataLoader(dl.RangeDataSource(1000), dl.SequentialSampler(1000),
                               [dl.MapTransform(wp.to_array), dl.Batch(16)], worker_count=2)
        it = iter(loader)
        next(it); next(it)
        print(" ".join(map(str, it._executor.pids)), flush=True)
        """
    ) as proc:
        out, err = proc.communicate(timeout=PATIENCE_S)
        assert proc.returncode == 0, err
        pids = [int(p) for p in out.split()]
        assert wait_until(lambda: not any(os.path.exists(f"/proc/{p}") for p in pids))
        assert not {b for b in shm_blocks() if b.startswith(f"granary_{proc.pid}_")}


def test_script_without_main_guard_runs_with_workers(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(
        """
        import dataloader as dl
        print("top level ran", flush=True)
        loader = dl.DataLoader(dl.RangeDataSource(100), dl.SequentialSampler(100),
                               [dl.MapTransform(lambda x: x * 2), dl.Batch(10)], worker_count=2)
        print(sum(int(b.sum()) for b in loader))
        """
    ))
    out = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["top", "level", "ran", str(2 * sum(range(100)))]


def _resources() -> dict[str, int]:
    """What a loader could leak, counted from /proc and /dev/shm."""
    return {
        "processes": len(child_pids()),
        "fds": len(os.listdir("/proc/self/fd")),
        "threads": len(os.listdir("/proc/self/task")),
        # This process's blocks only: other test runs on the machine make their own.
        "shm": len([b for b in shm_blocks() if b.startswith(f"granary_{os.getpid()}_")]),
    }


def _settled_resources() -> dict[str, int]:
    """:func:`_resources` once two readings half a second apart agree (or after a minute)."""
    readings = [_resources()]

    def steady() -> bool:
        time.sleep(0.5)
        readings.append(_resources())
        return readings[-1] == readings[-2]

    wait_until(steady)
    return readings[-1]


@pytest.mark.slow
@pytest.mark.timeout(900)  # about a minute on an idle 2-core machine; far more under load
def test_soak_of_a_hundred_create_iterate_break_cycles_leaks_nothing():
    """100 cycles of a new 2-worker loader, a few batches, break: counts stay where they were."""

    def cycle(i):
        loader = make_loader(workers=2, n=2000)
        for k, _ in enumerate(loader):
            if k == i % 4:
                break
        del loader
        gc.collect()

    cycle(0)  # first-use costs (imports, the interpreter's own caches) are not leaks
    # Its workers stop in the background; then the counts of the first cycle settle (a
    # reaper thread ends, a pipe closes): take them once they have stopped falling.
    assert wait_until(lambda: not child_pids())
    before = _settled_resources()
    started = time.monotonic()
    for i in range(100):
        cycle(i)
    seconds = time.monotonic() - started
    # No count grows (threads of earlier tests may end meanwhile, so a count may drop).
    settled = wait_until(lambda: all(v <= before[k] for k, v in _resources().items()))
    after = _resources()
    print(f"\nsoak: 100 cycles in {seconds:.1f} s; before {before}; after {after}; "
          f"/dev/shm holds {len(os.listdir('/dev/shm'))} entries")
    assert settled, f"after 100 cycles: {after}, before: {before}"


@pytest.mark.slow
def test_resident_memory_stays_flat_over_many_epochs():
    def rss_mb():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    loader = dl.DataLoader(
        dl.RangeDataSource(2000), dl.IndexSampler(2000, shuffle=True, seed=0),
        [dl.MapTransform(wp.to_array), dl.Batch(20)], worker_count=2,
    )
    it = iter(loader)
    samples = []
    for _ in range(12):
        for _ in range(100):
            next(it)
        gc.collect()
        samples.append(rss_mb())
    growth = samples[-1] - samples[2]
    assert growth < 8, f"resident memory grew {growth:.1f} MB over 10 epochs: {samples}"
    it.close()


def test_dropping_a_prefetched_pipeline_without_close_stops_its_workers():
    """A thread-prefetched pipeline over workers, dropped mid-stream: the prefetch thread
    holds the engine's iterator, so only the dropped iterator's finalizer can stop it."""

    class Doubling(dl.IterDataset):
        def __init__(self, parent):
            super().__init__(parent)

        def __iter__(self):
            return DoublingIterator(iter(self._parent))

    it = iter(Doubling(dl.MapDataset.range(10_000).to_iter_dataset()).batch(4).mp_prefetch(
        dl.MultiprocessingOptions(num_workers=2)))
    next(it)
    assert wait_until(lambda: len(child_pids()) >= 2)  # its 2 workers (the fork server stays)
    del it
    gc.collect()
    assert wait_until(lambda: not child_pids()), f"workers left: {child_pids()}"


class DoublingIterator(dl.DatasetIterator):
    def __init__(self, parent):
        super().__init__(parent)

    def __next__(self):
        return 2 * next(self._parent)

    def get_state(self):
        return {"parent": self._parent.get_state()}

    def set_state(self, state):
        self._parent.set_state(state["parent"])
