"""``pick_performance_config``: Grain's one-shot choice of workers and buffers.

Grain's ``grain.experimental.pick_performance_config(ds, ram_budget_mb=...,
max_workers=..., max_buffer_size=...)`` computes a few elements, measures their size and
returns a :class:`PerformanceConfig` whose ``multiprocessing_options`` go to
``ds.mp_prefetch(...)`` (MaxText does this when ``grain_worker_count=-1``). granary's
version measures the same way and prices a worker with the memory model of
``worker_count="auto"`` (:mod:`dataloader.engine.pool.autoscale`): a worker costs its
own private memory (:data:`WORKER_BASE_MB`) plus its result blocks, one per work unit
in flight (``per_worker_buffer_size``) and one being computed. A work unit is one batch
when the stream is batched, else ``unit_size`` elements, or by default (units sized by
cost) as many as fit 16 MiB, from 1 to 2048.

The choice, in order:

1. ``per_worker_buffer_size`` is 2 (the engine's default) or ``max_buffer_size`` if
   smaller; if not even one worker fits the budget that way, 1.
2. ``num_workers`` is as many as the budget pays for, at most ``max_workers`` (None:
   the CPUs this process may use). A budget too small for one worker gives
   ``num_workers=0``: the stream is computed in this process, which costs no worker
   memory (Grain's formula gives 0 there too), and a warning says so.
3. ``read_options.prefetch_buffer_size`` (units the in-process path reads ahead) takes
   what the budget has left, at most ``max_buffer_size`` (None: 8).

So the workers' memory plus the read-ahead stays within ``ram_budget_mb`` by this
model. ``ram_budget_mb=None`` means what this process may still use, keeping
``AutoWorkers().min_free_memory`` of it free and ``/dev/shm`` half free, as ``"auto"``
does (Grain's own function fails on None).

In a container, memory and CPUs are the container's
(:mod:`dataloader.engine.pool.autoscale.limits`): "what this process may still use" is
the smaller of the host's available memory and the container's limit less its use, the
CPUs are its CPU quota and affinity, and a ``ram_budget_mb`` above the memory the
container has left is lowered to it, with a warning naming the limit (a budget the
kernel does not grant ends in OOM kills). The output never depends on the choice:
it is the same for every worker count and buffer size.

Differences from Grain: the three budget arguments default to None (Grain requires
them, so every Grain call still works); measuring computes ``samples_to_check``
elements in this process (Grain does the same), so user code runs here once before
training; the CPU time per element is measured and logged, not used, so the choice
is a function of sizes, not timings.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import sys
import time
from typing import Any

import numpy as np

from dataloader.dataset.base import IterDataset
from dataloader.dataset.compile.nodes import is_batched
from dataloader.dataset.map_dataset import MapDataset
from dataloader.engine.sizing import unit_outputs
from dataloader.engine.stages.base import SupportsClose
from dataloader.options import AutoWorkers, MultiprocessingOptions, ReadOptions

# A pool worker forked from the fork server held 2.6 MiB of private memory after ten
# batches of a numpy map (smaps_rollup, granary's own pool); 8 MiB leaves room for the
# objects a pipeline builds in each worker.
WORKER_BASE_MB = 8.0
DEFAULT_BUFFER = 2  # MultiprocessingOptions' default per_worker_buffer_size
DEFAULT_READ_BUFFER = 8  # read-ahead cap when max_buffer_size is None
_MB = 2**20

log = logging.getLogger(__name__)


@dataclasses.dataclass(slots=True)
class PerformanceConfig:
    """What :func:`pick_performance_config` chose (Grain's fields).

    Attributes:
        multiprocessing_options: for ``ds.mp_prefetch(...)``.
        read_options: for ``ds.to_iter_dataset(...)`` (the in-process read-ahead).
    """

    multiprocessing_options: MultiprocessingOptions | None = None
    read_options: ReadOptions | None = None


def element_bytes(element: Any) -> int:
    """The bytes an element holds: arrays' buffers, nested dicts, lists and tuples,
    ``sys.getsizeof`` for anything else (as Grain counts them).

    Example:
        >>> element_bytes({"a": np.zeros(4, np.int64), "b": [np.zeros(2, np.int8)]})
        34
    """
    if isinstance(element, np.ndarray):
        return int(element.nbytes)
    if isinstance(element, dict):
        return sum(element_bytes(value) for value in element.values())
    if isinstance(element, (list, tuple)):
        return sum(element_bytes(value) for value in element)
    return sys.getsizeof(element)


def workers_within(budget_bytes: float, unit_bytes: float, buffer_size: int, cap: int) -> int:
    """Workers whose memory (``WORKER_BASE_MB`` plus ``buffer_size + 1`` units of
    ``unit_bytes`` each) fits ``budget_bytes``, at most ``cap``.

    Example:
        >>> workers_within(100 * 2**20, 10 * 2**20, 2, cap=16)   # 38 MiB a worker
        2
    """
    cost = WORKER_BASE_MB * _MB + (buffer_size + 1) * unit_bytes
    return max(0, min(cap, math.floor(budget_bytes / cost)))


def _check_optional_int(name: str, value: Any, low: int) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
        raise ValueError(f"pick_performance_config {name} must be None or an integer >= {low}, got {value!r}")


def _check(ds: Any, ram_budget_mb: Any, max_workers: Any, max_buffer_size: Any, samples: Any) -> None:
    if not isinstance(ds, (MapDataset, IterDataset)):
        raise TypeError(f"pick_performance_config needs a MapDataset or IterDataset, got {type(ds).__name__}: {ds!r:.100}")
    if ram_budget_mb is not None and (
        isinstance(ram_budget_mb, bool) or not isinstance(ram_budget_mb, (int, float)) or not ram_budget_mb > 0
    ):
        raise ValueError(
            f"pick_performance_config ram_budget_mb must be None or a number of megabytes > 0, "
            f"got {ram_budget_mb!r}"
        )
    _check_optional_int("max_workers", max_workers, 0)
    _check_optional_int("max_buffer_size", max_buffer_size, 1)
    _check_optional_int("samples_to_check", samples, 1)


def _outputs_per_unit(ds: Any, element_bytes: float) -> int:
    """Outputs of ``ds`` one work unit holds: 1 when they are batches, else the unit size
    (by default: as many outputs of ``element_bytes`` as a unit sized by cost holds)."""
    if isinstance(ds, MapDataset):
        return 1 if is_batched(ds._node) else unit_outputs(element_bytes)
    batched = getattr(ds, "_is_batched", None)
    if batched is None:
        return 1  # stages after the loader: their outputs are what the engine hands on
    options = getattr(ds, "_read_options", None)
    unit = getattr(options, "unit_size", None) or unit_outputs(element_bytes)
    return 1 if batched() else unit


def _measure(ds: Any, samples: int) -> tuple[float, float]:
    """(mean bytes, mean CPU seconds) of the first ``samples`` outputs of ``ds``."""
    iterator = iter(ds)
    sizes, began = [], time.process_time()
    try:
        for element in itertools.islice(iterator, samples):
            sizes.append(element_bytes(element))
    finally:
        if isinstance(iterator, SupportsClose):
            iterator.close()
    seconds = time.process_time() - began
    if not sizes:
        return 0.0, 0.0
    return float(np.mean(sizes)), seconds / len(sizes)


def _machine_budget(unit_bytes: float, buffer_size: int) -> int:
    """Workers the machine has room for now (``"auto"``'s rule), with the memory left
    for result blocks (memfds: bounded by the container's and the machine's memory)."""
    from dataloader.engine.pool.autoscale import room
    from dataloader.engine.pool.shm import block_room

    return room(AutoWorkers(), int(WORKER_BASE_MB * _MB), buffer_size + 1, int(unit_bytes), block_room())


def _within_container(ram_budget_mb: float) -> float:
    """``ram_budget_mb``, lowered to what the container has left where that is less."""
    from dataloader.engine.pool.autoscale.limits import gib, read_limits

    found = read_limits()
    left, words = found.available_memory, found.memory_words()
    if words is None or left is None or ram_budget_mb * _MB <= left:
        return ram_budget_mb
    log.warning(
        "pick_performance_config: ram_budget_mb=%s is more than this container has left "
        "(%s, of %s); budgeting %s instead",
        ram_budget_mb, gib(left), words, gib(left),
    )
    return max(left / _MB, 1e-6)


def pick_performance_config(
    ds: MapDataset | IterDataset,
    *,
    ram_budget_mb: float | None = None,
    max_workers: int | None = None,
    max_buffer_size: int | None = None,
    samples_to_check: int = 5,
) -> PerformanceConfig:
    """Chooses worker count and buffer sizes for ``ds`` from the size of its elements.

    See the module docstring for the memory model and the rules.

    Args:
        ds: the dataset to run (a ``MapDataset`` or an ``IterDataset``, before
            ``mp_prefetch``).
        ram_budget_mb: megabytes the workers and buffers may take (None: what the
            machine has available).
        max_workers: never more workers (None: the CPUs this process may use).
        max_buffer_size: never a larger buffer, per worker or read-ahead (None: 2 per
            worker, 8 read-ahead).
        samples_to_check: outputs computed to measure their size.

    Returns:
        A :class:`PerformanceConfig` with ``multiprocessing_options`` and
        ``read_options``.

    Raises:
        TypeError: ``ds`` is not a dataset.
        ValueError: a budget, bound or sample count out of range.

    Example:
        >>> import dataloader as dl
        >>> ds = dl.MapDataset.range(100).map(lambda i: np.zeros(2**18)).batch(4)  # 8 MiB
        >>> cfg = dl.experimental.pick_performance_config(
        ...     ds, ram_budget_mb=100, max_workers=8, max_buffer_size=None)
        >>> cfg.multiprocessing_options
        MultiprocessingOptions(num_workers=3, per_worker_buffer_size=2)
    """
    _check(ds, ram_budget_mb, max_workers, max_buffer_size, samples_to_check)
    mean_bytes, cpu_s = _measure(ds, samples_to_check)
    unit = mean_bytes * _outputs_per_unit(ds, mean_bytes)
    cap = max_workers
    if cap is None:
        from dataloader.engine.pool.autoscale import usable_cpus

        cap = usable_cpus()
    if ram_budget_mb is not None:
        ram_budget_mb = _within_container(ram_budget_mb)
    buffer = min(DEFAULT_BUFFER, max_buffer_size or DEFAULT_BUFFER)

    def fits(size: int) -> int:
        if ram_budget_mb is None:
            return min(cap, _machine_budget(unit, size))
        return workers_within(ram_budget_mb * _MB, unit, size, cap)

    workers = fits(buffer)
    if workers == 0 and buffer > 1 and cap > 0:
        buffer = 1
        workers = fits(buffer)
    if workers == 0 and cap > 0:
        log.warning(
            "pick_performance_config: a budget of %s MB does not hold one worker (%.1f MB "
            "each with %d buffered units of %.2f MB); computing in this process (num_workers=0)",
            ram_budget_mb, WORKER_BASE_MB + (buffer + 1) * unit / _MB, buffer, unit / _MB,
        )
    read_cap = max_buffer_size or DEFAULT_READ_BUFFER
    if ram_budget_mb is None or unit == 0:
        read_ahead = read_cap
    else:
        left = ram_budget_mb * _MB - workers * (WORKER_BASE_MB * _MB + (buffer + 1) * unit)
        read_ahead = max(0, min(read_cap, math.floor(left / unit)))
    log.info(
        "pick_performance_config: %.3f MB an output, %.3f ms CPU an output, %d outputs a "
        "unit: %d workers, %d units buffered each, read-ahead %d",
        mean_bytes / _MB, cpu_s * 1e3, _outputs_per_unit(ds, mean_bytes), workers, buffer, read_ahead,
    )
    return PerformanceConfig(
        multiprocessing_options=MultiprocessingOptions(num_workers=workers, per_worker_buffer_size=buffer),
        read_options=ReadOptions(prefetch_buffer_size=read_ahead),
    )
