"""Options that say how a pipeline runs, never what it yields, and their checks.

``ReadOptions`` (in-process read-ahead) and ``MultiprocessingOptions`` (worker processes)
live together here, as Grain keeps them; none of their fields changes a single batch.
Both are frozen dataclasses that check every field at construction: change them with
``dataclasses.replace``.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import os
from typing import Any

# How long a worker may compute one unit before the loader logs it as stuck.
DEFAULT_STALL_WARNING_S = 60.0


def check_int(name: str, value: Any, low: int) -> int:
    """``value`` if it is an integer (not a bool) >= ``low``, else a ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


def check_bool(name: str, value: Any) -> bool:
    """``value`` if it is a bool, else a TypeError naming it (``"no"`` is not False)."""
    if not isinstance(value, bool):
        raise TypeError(
            f"{name} must be True or False, got {value!r} of type {type(value).__name__}"
        )
    return value


def check_seconds(name: str, value: Any) -> float | None:
    """``value`` as seconds if it is a positive finite number (not a bool), or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
        math.isfinite(value) and value > 0
    ):
        raise ValueError(f"{name} must be a positive number of seconds or None, got {value!r}")
    return float(value)


FINGERPRINT_ENV = "GRANARY_FINGERPRINT"
"""The environment variable that turns the per-step fingerprint off (``0``) for loaders and
datasets that do not say (code you cannot edit, such as Grain code through the alias)."""


def fingerprint_default() -> bool:
    """``$GRANARY_FINGERPRINT`` as a switch: unset, ``1``, ``true`` or ``on``: True; ``0``,
    ``false`` or ``off``: False.

    Raises:
        ValueError: another value (named, with the ones accepted).
    """
    value = os.environ.get(FINGERPRINT_ENV, "").strip().lower()
    if value in ("", "1", "true", "on"):
        return True
    if value in ("0", "false", "off"):
        return False
    raise ValueError(
        f"{FINGERPRINT_ENV}={os.environ[FINGERPRINT_ENV]!r} is not a switch; set it to 0 (no per-step "
        f"fingerprint: states carry none and a restore checks none) or 1 (the default), or unset it"
    )


# The read-ahead's default bound in bytes (ReadOptions.prefetch_buffer_bytes).
DEFAULT_READ_AHEAD_BYTES = 256 * 2**20


@dataclasses.dataclass(frozen=True)
class ReadOptions:
    """How the in-process path (``worker_count=0``) reads ahead: Grain's ``ReadOptions``,
    in Grain's units. None of it changes the output.

    Args:
        num_threads: threads that read records ahead of the consumer (0: none; each unit
            reads its records when it is computed). A thread only reads: the source's
            read, which for files and URLs waits on storage and decodes in C with the GIL
            released. Every operation (map, filter, batch...) runs in the consumer's
            thread on records already read, where one thread computes them faster than
            many contending for the GIL; worker processes parallelise them.
        prefetch_buffer_size: records read ahead: read, or being read, and not yet taken
            by the consumer (Grain's meaning; MaxText passes 500). 0: no read-ahead.
        unit_size: positions per work unit when a filter or flat map precedes the batch
            or there is no batch. Default None: units sized by what they cost, from one
            position (so a first element costs one element) doubling while elements
            are cheap and small, up to about 50 ms of compute, 16 MiB of results or 2048
            positions (:mod:`~dataloader.engine.sizing`); an integer fixes every unit's
            size. Neither changes the output or the states. With a plain batch a unit
            is always exactly one batch.
        prefetch_buffer_bytes: at most about this many bytes of records read ahead
            (default 256 MiB; None: the record count alone bounds it). Records read are
            measured, those being read counted at the mean size seen so far, and the
            first read is one record, to learn it. 500 records of images or long
            documents can be gigabytes: the bytes bound keeps the count from meaning that.

    Example:
        >>> ReadOptions(num_threads=16, prefetch_buffer_size=500)
        ReadOptions(num_threads=16, prefetch_buffer_size=500, unit_size=None, prefetch_buffer_bytes=268435456)
    """

    num_threads: int = 0
    prefetch_buffer_size: int = 500
    unit_size: int | None = None
    prefetch_buffer_bytes: int | None = DEFAULT_READ_AHEAD_BYTES

    def __post_init__(self) -> None:
        check_int("ReadOptions.num_threads", self.num_threads, 0)
        check_int("ReadOptions.prefetch_buffer_size", self.prefetch_buffer_size, 0)
        if self.unit_size is not None:
            check_int("ReadOptions.unit_size", self.unit_size, 1)
        if self.prefetch_buffer_bytes is not None:
            check_int("ReadOptions.prefetch_buffer_bytes", self.prefetch_buffer_bytes, 1)


def _check_fraction(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ValueError(f"{name} must be a fraction in [0, 1), got {value!r}")
    return float(value)


@dataclasses.dataclass(frozen=True)
class AutoWorkers:
    """``worker_count="auto"``, tuned: the pool picks its own number of workers.

    It starts ``initial`` workers and, every ``interval_s`` while the consumer iterates,
    adds workers when the consumer waited for batches (as many as the wait says are
    missing, at most doubling) and retires idle ones (keeping one spare) when it did
    not wait for two intervals in a row, between ``min_workers`` and ``max_workers``.
    It adds a worker only while the machine keeps ``min_free_memory`` of its memory
    available after it (the worker's private memory and its result blocks, measured)
    and its result blocks fit in ``max_shm_share`` of the memory left (the blocks are
    shared memory without a name: the container's and the machine's memory bound them,
    not the size of ``/dev/shm``). Buffers
    follow: ``worker_buffer_size`` units in flight per worker. The output is the same
    whatever the count, so workers come and go mid-epoch without changing a batch.

    Args:
        min_workers: never fewer (at least 1).
        max_workers: never more (None: the CPUs this process may use).
        initial: workers at the start (None: half of ``max_workers``, at least 1).
        interval_s: how often the count is reconsidered.
        min_free_memory: share of the machine's memory left available.
        max_shm_share: share of the memory left that the added result blocks may take.

    ``worker_init_fn(index, count)`` receives ``max_workers`` as ``count``.

    Example:
        >>> AutoWorkers(max_workers=8).bounds(cpus=16)
        (1, 8, 4)
    """

    min_workers: int = 1
    max_workers: int | None = None
    initial: int | None = None
    interval_s: float = 0.5
    min_free_memory: float = 0.2
    max_shm_share: float = 0.5

    def __post_init__(self) -> None:
        check_int("AutoWorkers.min_workers", self.min_workers, 1)
        if self.max_workers is not None:
            check_int("AutoWorkers.max_workers", self.max_workers, self.min_workers)
        if self.initial is not None:
            check_int("AutoWorkers.initial", self.initial, self.min_workers)
            if self.max_workers is not None and self.initial > self.max_workers:
                raise ValueError(
                    f"AutoWorkers.initial={self.initial} is above max_workers={self.max_workers}"
                )
        check_seconds("AutoWorkers.interval_s", self.interval_s)
        _check_fraction("AutoWorkers.min_free_memory", self.min_free_memory)
        _check_fraction("AutoWorkers.max_shm_share", self.max_shm_share)

    def bounds(self, cpus: int) -> tuple[int, int, int]:
        """``(low, high, initial)`` on a machine with ``cpus`` usable CPUs."""
        high = self.max_workers if self.max_workers is not None else max(self.min_workers, cpus)
        start = self.initial if self.initial is not None else max(self.min_workers, high // 2)
        return self.min_workers, high, min(start, high)


def check_worker_count(name: str, value: Any) -> int | AutoWorkers:
    """An integer >= 0, or ``"auto"`` (then :class:`AutoWorkers`), else a ValueError.

    A negative count is refused, as Grain's ``DataLoader`` refuses it, rather than read
    as "auto": -1 is MaxText's config spelling of auto-tuning (its adapter,
    ``dataloader.maxtext``, translates it), and here it could as well be an off-by-one.
    The message says how to ask for auto.
    """
    if value == "auto":
        return AutoWorkers()
    if isinstance(value, AutoWorkers):
        return value
    if isinstance(value, str):
        raise ValueError(f'{name} must be an integer >= 0 or "auto", got {value!r}')
    if isinstance(value, int) and not isinstance(value, bool) and value < 0:
        short = name.rsplit(".", 1)[-1]
        raise ValueError(
            f'{name} must be an integer >= 0 or "auto", got {value}; to let the pool choose '
            f'and change the number of workers (what MaxText\'s grain_worker_count=-1 asks '
            f'for), pass {short}="auto"'
        )
    return check_int(name, value, 0)


WORKER_KINDS = ("processes", "threads", "auto")


def check_worker_kind(name: str, value: Any) -> str:
    """One of :data:`WORKER_KINDS`; None: ``GRANARY_WORKER_KIND`` from the environment
    (so unchanged code can try threads), else ``"processes"``."""
    if value is None:
        value = os.environ.get("GRANARY_WORKER_KIND") or "processes"
        name = f"{name} (from GRANARY_WORKER_KIND)"
    if value not in WORKER_KINDS:
        raise ValueError(
            f'{name} must be "processes", "threads" or "auto", got {value!r}; "threads" '
            f'suits work that releases the GIL (decoders, numpy, zlib, Rust tokenizers), '
            f'"auto" measures it'
        )
    return str(value)


def most_workers(value: int | str | AutoWorkers) -> int:
    """The most workers a ``worker_count`` may run at once (for sizing buffers)."""
    count = check_worker_count("worker_count", value)
    if isinstance(count, AutoWorkers):
        return count.bounds(len(os.sched_getaffinity(0)))[1]
    return count


@dataclasses.dataclass(frozen=True)
class MultiprocessingOptions:
    """How many worker processes compute the stream, and how far ahead.

    Args:
        num_workers: child processes (0: compute in this process), or ``"auto"`` (or an
            :class:`AutoWorkers`): the pool picks and changes it as it runs. The output
            is the same for every value.
        per_worker_buffer_size: work units (a batch each, usually) in flight per worker.
        worker_kind: ``"processes"``, ``"threads"`` or ``"auto"`` (as the loader's
            ``worker_kind``; None: ``GRANARY_WORKER_KIND``, else processes).

    Example:
        >>> MultiprocessingOptions(num_workers=2)
        MultiprocessingOptions(num_workers=2, per_worker_buffer_size=2, worker_kind=None)
    """

    num_workers: int | str | AutoWorkers = 0
    per_worker_buffer_size: int = 2
    worker_kind: str | None = None

    def __post_init__(self) -> None:
        check_worker_count("MultiprocessingOptions.num_workers", self.num_workers)
        check_int("MultiprocessingOptions.per_worker_buffer_size", self.per_worker_buffer_size, 1)
        if self.worker_kind is not None:
            check_worker_kind("MultiprocessingOptions.worker_kind", self.worker_kind)


class ExecutionTrackingMode(enum.Enum):
    """Grain's statistics modes. granary's stats are always collected (per unit, a few
    clock reads; see ``iterator.stats()``), so both modes behave alike here."""

    DISABLED = enum.auto()
    STAGE_TIMING = enum.auto()


class _Unset:
    """The default of a ``DatasetOptions`` field the user did not set."""

    def __repr__(self) -> str:
        return "unset"


UNSET: Any = _Unset()

_DATASET_DEFAULTS: dict[str, Any] = {
    "filter_warn_threshold_ratio": 0.9,
    "filter_raise_threshold_ratio": None,
    "execution_tracking_mode": ExecutionTrackingMode.DISABLED,
    "min_shm_size": 0,
    "audit_log": None,
    "fingerprint": None,  # None: DataLoader(fingerprint=...), else $GRANARY_FINGERPRINT
}


def _check_ratio(name: str, value: Any) -> None:
    if value is not UNSET and value is not None and (
        isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1
    ):
        raise ValueError(f"DatasetOptions.{name} must be None or a ratio in [0, 1], got {value!r}")


@dataclasses.dataclass(frozen=True)
class DatasetOptions:
    """Options of a dataset pipeline, as Grain's (``WithOptionsIterDataset`` applies them).

    Args:
        filter_warn_threshold_ratio: warn when filters drop more than this share of a
            window of 1,000 records read (None: never; default 0.9, as in Grain).
        filter_raise_threshold_ratio: raise instead (None: never; the default).
        execution_tracking_mode: accepted for Grain's code (stats are always on here).
        min_shm_size: accepted for Grain's code: results travel in one shared-memory
            block per work unit whatever the size of their arrays.
        audit_log: granary's own: ``DataLoader(audit_log=...)`` for the dataset's
            iterators, a path to append a JSON line per step to (``{shard}``: the shard
            index; docs/fingerprint-audit.md), or None.
        fingerprint: granary's own: ``DataLoader(fingerprint=...)`` for the dataset's
            iterators. False: states carry no fingerprint of their last step and a
            restore checks none (no audit that the data and operations are those the
            state was made with), which saves hashing every record and output, 5-33 us
            a row. Unset: ``$GRANARY_FINGERPRINT`` (``0``: off), else on.

    Options set explicitly win over those of :meth:`merge`'s argument, which win over
    the defaults.

    Example:
        >>> DatasetOptions(filter_raise_threshold_ratio=0.5).merge(
        ...     DatasetOptions(filter_warn_threshold_ratio=0.2)).get("filter_warn_threshold_ratio")
        0.2
    """

    filter_warn_threshold_ratio: float | None = UNSET
    filter_raise_threshold_ratio: float | None = UNSET
    execution_tracking_mode: ExecutionTrackingMode = UNSET
    min_shm_size: int = UNSET
    audit_log: str | None = UNSET
    fingerprint: bool = UNSET

    def __post_init__(self) -> None:
        _check_ratio("filter_warn_threshold_ratio", self.filter_warn_threshold_ratio)
        _check_ratio("filter_raise_threshold_ratio", self.filter_raise_threshold_ratio)
        mode = self.execution_tracking_mode
        if mode is not UNSET and not isinstance(mode, ExecutionTrackingMode):
            raise TypeError(f"execution_tracking_mode must be an ExecutionTrackingMode, got {mode!r}")
        if self.min_shm_size is not UNSET:
            check_int("DatasetOptions.min_shm_size", self.min_shm_size, 0)
        if self.audit_log not in (UNSET, None) and not isinstance(self.audit_log, (str, os.PathLike)):
            raise TypeError(f"DatasetOptions.audit_log must be a path (str or os.PathLike) or None, got {self.audit_log!r}")
        if self.fingerprint is not UNSET:
            check_bool("DatasetOptions.fingerprint", self.fingerprint)

    def get(self, name: str) -> Any:
        """The option's value: as set, else Grain's default."""
        value = getattr(self, name)
        return _DATASET_DEFAULTS[name] if value is UNSET else value

    def merge(self, other: DatasetOptions | None) -> DatasetOptions:
        """These options, with ``other``'s filling what these do not set."""
        if other is None:
            return self
        return DatasetOptions(**{
            f.name: getattr(self, f.name) if getattr(self, f.name) is not UNSET else getattr(other, f.name)
            for f in dataclasses.fields(self)
        })
