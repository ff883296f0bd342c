"""The machine's own ceiling, and a minimal fork pool: the reference rows of scaling.

* ``ceiling``: N independent processes, each reading and decoding its share of the
  records (batches ``k`` with ``k % N == i``, in the shared order) with
  ``ArrayRecordReader`` and no framework at all: no pool, no ordering, no transport
  back to a parent. They start together (a barrier) once they have opened their
  readers; the window opens at the first batch any of them finishes. Their sum is
  what this machine can do with N processes.
* ``fork_pool``: W processes forked from the measuring process, pulling batches from
  one queue and putting results (pickled, through a pipe) on another, read unordered:
  no ordering, no state, no recovery (the 60-line pool the scaling issue measured).

Both report what ``peers.measure`` reports, with the window opened at the first batch.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from peers import ArrayRecordFiles, Measurement, count_records_elsewhere


def _share(rank: int, n: int, files: ArrayRecordFiles, order: np.ndarray, batch_size: int,
           barrier: Any, seconds: float, results: Any) -> None:
    batches = [order[k * batch_size:(k + 1) * batch_size]
               for k in range(rank, len(order) // batch_size, n)]
    files.read_batch(batches[0][:1])  # open the readers before the clock
    barrier.wait()
    cpu0, times = time.process_time(), []
    deadline = time.perf_counter() + seconds + 1.0
    for batch in batches:
        files.read_batch(batch)
        now = time.perf_counter()
        times.append(now)
        if now >= deadline:
            break
    results.put((rank, times, time.process_time() - cpu0))


def ceiling_loader(paths: Sequence[str], order: np.ndarray, decode: str, batch_size: int,
                   workers: int, *, warmup_batches: int, max_seconds: float) -> Measurement:
    """N = ``workers`` (at least 1) independent processes; see the module docstring."""
    n = max(workers, 1)
    counts = count_records_elsewhere(paths)  # this process opens no reader before forking
    files = ArrayRecordFiles(paths, decode, counts=counts)
    context = multiprocessing.get_context("fork")
    barrier, results = context.Barrier(n), context.Queue()
    procs = [context.Process(target=_share, args=(i, n, files, order, batch_size, barrier,
                                                  max_seconds, results)) for i in range(n)]
    for p in procs:
        p.start()
    got = [results.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    stamps = np.sort(np.concatenate([np.asarray(times) for _, times, _ in got]))
    first = stamps[0]
    window = stamps[stamps <= first + max_seconds]
    seconds = max(float(window[-1] - first), 1e-9)
    cpu = sum(c for _, _, c in got)
    return Measurement(
        records=len(window) * batch_size, seconds=seconds,
        records_per_s=len(window) * batch_size / seconds, first_batch_s=0.0, peak_pss_mb=0.0,
        parent_cpu_ms_per_batch=0.0, batch_shape=[batch_size],
        notes=f"{n} independent processes, no framework",
        tree_cpu_us_per_record=1e6 * cpu / (len(stamps) * batch_size),
        ramp_records_per_s=float((stamps <= first + 1.0).sum()) * batch_size / min(1.0, seconds),
    )


def _pool_worker(files: ArrayRecordFiles, tasks: Any, results: Any) -> None:
    while True:
        indices = tasks.get()
        if indices is None:
            return
        results.put(files.read_batch(indices))


class ForkPool:
    """W forked workers pulling batches from one queue, results back unordered."""

    def __init__(self, files: ArrayRecordFiles, batches: list[np.ndarray], workers: int) -> None:
        context = multiprocessing.get_context("fork")
        self._tasks, self._results = context.Queue(), context.Queue(maxsize=4 * workers)
        for batch in batches:
            self._tasks.put(batch)
        for _ in range(workers):
            self._tasks.put(None)
        self._left = len(batches)
        self._procs = [context.Process(target=_pool_worker, args=(files, self._tasks, self._results),
                                       daemon=True) for _ in range(workers)]
        for p in self._procs:
            p.start()

    def __iter__(self) -> ForkPool:
        return self

    def __next__(self) -> np.ndarray:
        if not self._left:
            raise StopIteration
        self._left -= 1
        return self._results.get(timeout=120)

    def close(self) -> None:
        for p in self._procs:
            p.kill()
        for p in self._procs:
            p.join()
        for q in (self._tasks, self._results):
            q.cancel_join_thread()
            q.close()


def fork_pool_loader(paths: Sequence[str], order: np.ndarray, decode: str, batch_size: int,
                     workers: int, *, warmup_batches: int, max_seconds: float) -> Measurement:
    """A minimal fork pool (:class:`ForkPool`); see the module docstring."""
    from peers import measure

    counts = count_records_elsewhere(paths)
    files = ArrayRecordFiles(paths, decode, counts=counts)
    batches = [order[k * batch_size:(k + 1) * batch_size] for k in range(len(order) // batch_size)]
    return measure(lambda: ForkPool(files, batches, max(workers, 1)), batch_size, len(order),
                   warmup_batches=warmup_batches, max_seconds=max_seconds,
                   notes="a minimal fork pool: one task queue, results unordered, no state")
