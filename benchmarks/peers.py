"""One function per framework: read the same ArrayRecord files, decode, batch, measure.

Every function has the signature of :data:`LOADERS`' values::

    fn(paths, order, decode, batch_size, workers, *, warmup_batches, max_seconds)
        -> Measurement

``order`` holds the record indices to read. ``raw_array_record`` reads exactly
those, in that order; the frameworks shuffle with their own seeded samplers (their
orders differ from ours and from each other) and read up to ``len(order)`` records,
so every row has the same cap on its work (the time cap may end it sooner).

The measurement (see :func:`measure`):

* ``first_batch_s``: from building the loader (sources, sampler, worker start)
  to the first batch in hand. Imports are done before the clock starts.
* ``records_per_s``: after ``warmup_batches`` batches, the rate until
  ``len(order)`` records or ``max_seconds``, whichever comes first.
* ``peak_pss_mb``: the highest sum of PSS over this process and all its
  descendants, sampled every 250 ms by ``pss_monitor.py`` in a process of its own
  (PSS splits shared pages between the processes that map them, so the sum does
  not count a forked child's inherited pages twice).
* ``parent_cpu_ms_per_batch``: user+system CPU of this process (all its threads)
  over the timed batches, per batch: what the loader costs the training process.
* ``tree_cpu_us_per_record``: user+system CPU of this process and all its live
  descendants (read from ``/proc``) over the timed batches, per record.
* ``ramp_records_per_s``: records in the first second after the first batch (the
  warm-up is not skipped for it): how fast a loader gets going.

Frameworks are imported inside their function: a worker started with ``spawn``
imports this module only if a pipeline object lives in it, and then stays light.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import decoders
import numpy as np

Loader = Callable[..., "Measurement"]


@dataclasses.dataclass
class Measurement:
    """What one (framework, workers, data set) run measured."""

    records: int  # records in the timed part (after warm-up)
    seconds: float  # length of the timed part
    records_per_s: float
    first_batch_s: float
    peak_pss_mb: float
    parent_cpu_ms_per_batch: float
    batch_shape: list[int]
    notes: str = ""
    tree_cpu_us_per_record: float = 0.0
    ramp_records_per_s: float = 0.0


# ------------------------------------------------------------------- measuring


class _PssMonitor:
    """Runs ``pss_monitor.py`` on this process tree; :meth:`stop` returns the peak bytes."""

    # One sample costs ~4 ms of CPU (the kernel walks every mapping of every process);
    # at 50 ms that took ~8% of a core from exactly the rows that keep both cores busy.
    # Peak PSS here is a plateau (buffers, pools), so 250 ms loses nothing.
    def __init__(self, interval: float = 0.25):
        self._process = subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).with_name("pss_monitor.py")),
                str(os.getpid()),
                str(interval),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._process.stdout is not None
        if self._process.stdout.readline().strip() != "ready":
            raise RuntimeError("pss_monitor.py did not start")

    def stop(self) -> int:
        stdout, _ = self._process.communicate("stop\n", timeout=60)
        return int(stdout.split()[-1])


def _process_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


_TICK = os.sysconf("SC_CLK_TCK")


def _stat_cpu(pid: int) -> tuple[int, float] | None:
    """(parent pid, user+system CPU seconds) of a live process, from /proc/PID/stat."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICK


def tree_cpu(root: int | None = None) -> float:
    """CPU seconds of ``root`` (default: this process) and all its live descendants."""
    root = os.getpid() if root is None else root
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat_cpu(int(entry))
            if stat is not None:
                stats[int(entry)] = stat
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, _) in stats.items():
            if ppid == parent and pid not in tree:
                tree.add(pid)
                frontier.append(pid)
    return sum(stats[pid][1] for pid in tree if pid in stats)


def measure(
    make_iterator: Callable[[], Iterator[Any]],
    batch_size: int,
    num_records: int,
    *,
    warmup_batches: int,
    max_seconds: float,
    notes: str = "",
) -> Measurement:
    """Runs ``make_iterator()`` and times it as the module docstring says."""
    total_batches = num_records // batch_size
    if total_batches <= warmup_batches:
        raise ValueError(
            f"{num_records} records make {total_batches} batches of {batch_size}, "
            f"not more than the {warmup_batches} warm-up batches; measure more records"
        )
    monitor = _PssMonitor()
    started = time.perf_counter()
    iterator = make_iterator()
    first = next(iterator)
    first_at = time.perf_counter()
    first_batch_s = first_at - started
    batch_shape = list(np.shape(first))
    ramp_batches = 1
    for _ in range(max(warmup_batches, 1) - 1):
        next(iterator)
        ramp_batches += time.perf_counter() - first_at <= 1.0

    timed = 0
    cpu_before, tree_before = _process_cpu(), tree_cpu()
    timer = time.perf_counter()
    if not warmup_batches:  # timed from the first batch on: it counts, its wait does not
        timer, timed = first_at, 1
    deadline = timer + max_seconds
    for _ in range(total_batches - max(warmup_batches, 1)):
        try:
            next(iterator)
        except StopIteration:
            # grain batches within each worker's slice, so with drop_remainder
            # it may yield fewer than num_records // batch_size batches.
            break
        now = time.perf_counter()
        timed += 1
        ramp_batches += now - first_at <= 1.0
        if now >= deadline:
            break
    seconds = time.perf_counter() - timer
    cpu = _process_cpu() - cpu_before
    tree = tree_cpu() - tree_before
    peak_pss = monitor.stop()

    close = getattr(iterator, "close", None) or getattr(iterator, "_shutdown_workers", None)
    if close is not None:
        close()
    del iterator
    return Measurement(
        records=timed * batch_size,
        seconds=seconds,
        records_per_s=timed * batch_size / seconds,
        first_batch_s=first_batch_s,
        peak_pss_mb=peak_pss / 2**20,
        parent_cpu_ms_per_batch=1000 * cpu / timed,
        batch_shape=batch_shape,
        notes=notes,
        tree_cpu_us_per_record=1e6 * tree / (timed * batch_size),
        ramp_records_per_s=ramp_batches * batch_size / min(1.0, max(time.perf_counter() - first_at, 1e-9)),
    )


# ---------------------------------------------------------------- no framework


class ArrayRecordFiles:
    """Several ArrayRecord files as one indexable sequence of decoded records.

    Readers open lazily, per process (keyed by pid), so an instance can be
    pickled to spawned workers or inherited by forked ones. Also serves as
    torch's map-style dataset: it needs only ``__len__`` and ``__getitem__``.
    """

    def __init__(
        self,
        paths: Sequence[str],
        decode: str = "none",
        read_call: str = "range",
        counts: Sequence[int] | None = None,
    ):
        self._paths = list(paths)
        self._decode_name = decode
        self._decode = decoders.get(decode)
        if read_call not in ("range", "list"):
            raise ValueError(f"read_call must be 'range' or 'list', got {read_call!r}")
        self.read_call = read_call
        if counts is None:
            counts = count_records(self._paths)
        self._starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self._readers: list[Any] = []
        self._pid = -1

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_readers": [], "_pid": -1, "_decode": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._decode = decoders.get(self._decode_name)

    def __len__(self) -> int:
        return int(self._starts[-1])

    def _open(self) -> list[Any]:
        if self._pid != os.getpid():
            from array_record.python.array_record_module import ArrayRecordReader

            self._readers = [ArrayRecordReader(p) for p in self._paths]
            self._pid = os.getpid()
        return self._readers

    def read(self, index: int) -> bytes:
        readers = self._open()
        file = int(np.searchsorted(self._starts, index, side="right")) - 1
        local = int(index - self._starts[file])
        if self.read_call == "range":
            return readers[file].read(local, local + 1)[0]
        return readers[file].read([local])[0]

    def __getitem__(self, index: int) -> np.ndarray:
        return self._decode(self.read(index))

    def read_batch(self, indices: np.ndarray) -> np.ndarray:
        """Reads, decodes and stacks ``indices``; one file lookup per batch."""
        readers = self._open()
        files = np.searchsorted(self._starts, indices, side="right") - 1
        locals_ = indices - self._starts[files]
        decode = self._decode
        if self.read_call == "range":
            out = [
                decode(readers[f].read(i, i + 1)[0])
                for f, i in zip(files.tolist(), locals_.tolist(), strict=True)
            ]
        else:
            out = [
                decode(readers[f].read([i])[0])
                for f, i in zip(files.tolist(), locals_.tolist(), strict=True)
            ]
        return np.stack(out)


def count_records(paths: Sequence[str]) -> list[int]:
    """Records per file, read in this process."""
    from array_record.python.array_record_module import ArrayRecordReader

    counts = []
    for path in paths:
        reader = ArrayRecordReader(str(path))
        counts.append(reader.num_records())
        reader.close()
    return counts


def count_records_elsewhere(paths: Sequence[str]) -> list[int]:
    """:func:`count_records` in a spawned process, so this one never opens a reader.

    Once a process has opened an ArrayRecordReader, readers opened in its
    ``fork``-ed torch workers crash with SIGSEGV (array_record 0.8.6, torch 2.13).
    """
    import concurrent.futures
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
        return pool.submit(count_records, list(paths)).result()


def fastest_read_call(
    files: ArrayRecordFiles, order: np.ndarray, probes: int = 500
) -> tuple[str, str]:
    """Times ``read(i, i + 1)`` against ``read([i])``; returns the faster and a note."""
    sample = order[:probes].tolist()
    timings = {}
    for call in ("range", "list", "range", "list"):  # twice each: the first pass warms the cache
        files.read_call = call
        started = time.perf_counter()
        for index in sample:
            files.read(index)
        timings[call] = (time.perf_counter() - started) / len(sample)
    best = min(timings, key=timings.__getitem__)
    files.read_call = best
    note = f"read(i,i+1) {timings['range'] * 1e6:.1f}us vs read([i]) {timings['list'] * 1e6:.1f}us"
    return best, note


def raw_array_record(
    paths: Sequence[str],
    order: np.ndarray,
    decode: str,
    batch_size: int,
    workers: int,
    *,
    warmup_batches: int,
    max_seconds: float,
) -> Measurement:
    """No framework: this process reads ``order`` and decodes, the physical limit."""
    if workers != 0:
        raise ValueError(f"raw_array_record runs in one process; got workers={workers}")
    probe = ArrayRecordFiles(paths, decode)
    call, note = fastest_read_call(probe, order)

    def make_iterator() -> Iterator[np.ndarray]:
        files = ArrayRecordFiles(paths, decode, read_call=call)
        for start in range(0, len(order) - batch_size + 1, batch_size):
            yield files.read_batch(order[start : start + batch_size])

    return measure(
        make_iterator,
        batch_size,
        len(order),
        warmup_batches=warmup_batches,
        max_seconds=max_seconds,
        notes=note,
    )


# ----------------------------------------------------------------------- grain


def _grain_decode(name: str):
    import grain.python as gp

    # Defined here so that importing this module never imports grain; cloudpickle
    # ships the class to grain's workers by value.
    class Decode(gp.MapTransform):
        def __init__(self, name: str):
            self.name = name

        def map(self, element: bytes) -> np.ndarray:
            return decoders.get(self.name)(element)

    return Decode(name)


def grain_loader(
    paths: Sequence[str],
    order: np.ndarray,
    decode: str,
    batch_size: int,
    workers: int,
    *,
    warmup_batches: int,
    max_seconds: float,
    read_threads: int | None = None,
) -> Measurement:
    """Grain's DataLoader with its ArrayRecordDataSource and IndexSampler.

    ``read_threads`` None keeps grain's default ReadOptions (16 reading threads and
    a 500-record buffer per process); 0 reads in the iterating thread, which grain
    recommends for fast local sources.
    """
    import grain.python as gp
    from absl import flags

    # Grain reads absl flags when it starts workers; a program not run by
    # absl.app.run has to mark them parsed itself or grain raises.
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
    read_options = None
    notes = ""
    if read_threads is not None:
        read_options = gp.ReadOptions(
            num_threads=read_threads, prefetch_buffer_size=0 if read_threads == 0 else 500
        )
        notes = f"ReadOptions(num_threads={read_threads}, prefetch_buffer_size={read_options.prefetch_buffer_size})"

    def make_iterator() -> Iterator[Any]:
        source = gp.ArrayRecordDataSource(list(paths))
        sampler = gp.IndexSampler(
            num_records=len(source),
            shard_options=gp.NoSharding(),
            shuffle=True,
            num_epochs=1,
            seed=0,
        )
        loader = gp.DataLoader(
            data_source=source,
            sampler=sampler,
            operations=[
                _grain_decode(decode),
                gp.Batch(batch_size=batch_size, drop_remainder=True),
            ],
            worker_count=workers,
            read_options=read_options,
        )
        return iter(loader)

    return measure(
        make_iterator,
        batch_size,
        len(order),
        warmup_batches=warmup_batches,
        max_seconds=max_seconds,
        notes=notes,
    )


def grain_nothreads_loader(*args: Any, **kwargs: Any) -> Measurement:
    """grain_loader with ReadOptions(num_threads=0, prefetch_buffer_size=0)."""
    return grain_loader(*args, **kwargs, read_threads=0)


# ----------------------------------------------------------------------- torch


def torch_loader(
    paths: Sequence[str],
    order: np.ndarray,
    decode: str,
    batch_size: int,
    workers: int,
    *,
    warmup_batches: int,
    max_seconds: float,
    multiprocessing_context: str | None = None,
) -> Measurement:
    """torch.utils.data.DataLoader over a map-style dataset, default collate.

    ``multiprocessing_context`` None is torch's default (``fork`` on Linux), which a
    JAX program should avoid; ``torch_spawn`` rows pass ``"spawn"``.
    """
    import torch
    from torch.utils.data import DataLoader

    context = multiprocessing_context if workers else None
    notes = f"workers by {context or 'fork'}" if workers else ""
    counts = None
    if workers and context in (None, "fork"):
        counts = count_records_elsewhere(paths)
        notes += ", record counts read before the clock in a spawned process (fork safety)"

    def make_iterator() -> Iterator[Any]:
        dataset = ArrayRecordFiles(paths, decode, counts=counts)
        loader = DataLoader(
            dataset,
            batch_size=batch_size,
            shuffle=True,
            generator=torch.Generator().manual_seed(0),
            num_workers=workers,
            drop_last=True,
            multiprocessing_context=context,
        )
        return iter(loader)

    return measure(
        make_iterator,
        batch_size,
        len(order),
        warmup_batches=warmup_batches,
        max_seconds=max_seconds,
        notes=notes,
    )


def torch_spawn_loader(*args: Any, **kwargs: Any) -> Measurement:
    """torch_loader with workers started by ``spawn``, as a JAX program would."""
    return torch_loader(*args, **kwargs, multiprocessing_context="spawn")


# --------------------------------------------------------------------- granary


def granary_loader(
    paths: Sequence[str],
    order: np.ndarray,
    decode: str,
    batch_size: int,
    workers: int,
    *,
    warmup_batches: int,
    max_seconds: float,
    worker_count: Any = None,
    notes: str = "",
) -> Measurement:
    """Our DataLoader, through its documented public API (``worker_count``: instead of
    ``workers``, e.g. an ``AutoWorkers``)."""
    import dataloader as dl

    def make_iterator() -> Iterator[Any]:
        source = dl.ArrayRecordDataSource(list(paths))
        sampler = dl.IndexSampler(num_records=len(source), shuffle=True, seed=0, num_epochs=1)
        loader = dl.DataLoader(
            data_source=source,
            sampler=sampler,
            operations=[
                dl.MapTransform(decoders.get(decode)),
                dl.Batch(batch_size=batch_size, drop_remainder=True),
            ],
            worker_count=workers if worker_count is None else worker_count,
        )
        return iter(loader)

    return measure(
        make_iterator,
        batch_size,
        len(order),
        warmup_batches=warmup_batches,
        max_seconds=max_seconds,
        notes=notes,
    )


def granary_spawn_loader(*args: Any, **kwargs: Any) -> Measurement:
    """Our DataLoader with every worker started as a fresh interpreter, as before the
    fork server (``GRANARY_FORK_SERVER=0``): the fork server's effect, in one run."""
    os.environ["GRANARY_FORK_SERVER"] = "0"  # read when the pool's module is imported
    return granary_loader(*args, **kwargs)


def granary_auto_loader(paths: Sequence[str], order: np.ndarray, decode: str, batch_size: int,
                        workers: int, **kwargs: Any) -> Measurement:
    """Our DataLoader with ``worker_count="auto"`` capped at ``workers`` (at least 1),
    starting at 1: how fast it finds the count a hungry consumer needs."""
    import dataloader as dl

    auto = dl.AutoWorkers(max_workers=max(workers, 1), initial=1, interval_s=0.25)
    return granary_loader(paths, order, decode, batch_size, workers, worker_count=auto,
                          notes="worker_count=AutoWorkers(max_workers=N, initial=1)", **kwargs)


LOADERS: dict[str, Loader] = {
    "raw": raw_array_record,
    "granary": granary_loader,
    "granary_spawn": granary_spawn_loader,
    "granary_auto": granary_auto_loader,
    "grain": grain_loader,
    "grain_nothreads": grain_nothreads_loader,
    "torch": torch_loader,
    "torch_spawn": torch_spawn_loader,
}
