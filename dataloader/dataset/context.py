"""What a pipeline's outer calls pass down to the datasets it reads, while its iterator
is built: worker processes (``mp_prefetch``) and dataset options (``WithOptionsIterDataset``).

An outer dataset sets a context variable around ``iter(parent)``; the datasets that make
their iterators inside read it. So options reach the engine-backed stream at the bottom
of a pipeline without the datasets between them knowing of it.

Code that never calls ``mp_prefetch`` (torchtitan's Grain loader uses threads only) gets
worker processes from the environment: ``GRANARY_WORKER_COUNT=N`` (or ``auto``) gives
every engine-backed stream that asked for none ``N`` workers. The output does not change
with it (worker count is not part of the output), so this is a deployment setting, not
a change to the pipeline. Worker processes see ``0``: a stream built inside one stays in
that process.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator
from typing import Any

from dataloader.dataset.base import IterDataset
from dataloader.errors import ConfigError
from dataloader.options import DatasetOptions, MultiprocessingOptions

WORKERS_VARIABLE = "GRANARY_WORKER_COUNT"

_WORKERS: contextvars.ContextVar[tuple[MultiprocessingOptions, Any] | None] = (
    contextvars.ContextVar("granary_workers", default=None)
)
_OPTIONS: contextvars.ContextVar[DatasetOptions | None] = contextvars.ContextVar(
    "granary_dataset_options", default=None
)
# Whether an iterator is being built under an outer iter() (which set the pipeline's options).
_BUILDING: contextvars.ContextVar[bool] = contextvars.ContextVar("granary_building", default=False)


def inherited_workers() -> tuple[MultiprocessingOptions, Any] | None:
    """The ``(options, worker_init_fn)`` of an enclosing ``mp_prefetch``, else those of
    ``GRANARY_WORKER_COUNT``, else None."""
    found = _WORKERS.get()
    return found if found is not None else default_workers()


def default_workers() -> tuple[MultiprocessingOptions, Any] | None:
    """The workers ``GRANARY_WORKER_COUNT`` asks for (None when unset, empty or 0).

    Raises:
        ConfigError: the value is neither a count >= 0 nor ``auto``.
    """
    value = os.environ.get(WORKERS_VARIABLE, "").strip()
    if value in ("", "0"):
        return None
    count: int | str = value
    if value != "auto":
        try:
            count = int(value)
        except ValueError:
            count = -1
        if count < 0:
            raise ConfigError(
                f"{WORKERS_VARIABLE}={value!r}: expected a worker count (an integer >= 0) "
                f"or 'auto'; set it to 0 or unset it to compute in this process"
            )
    return MultiprocessingOptions(num_workers=count), None


def default_worker_count() -> int:
    """The workers ``mp_prefetch()`` starts when given no options: one per CPU this
    process may use, which in a container is its CPU quota (``cpu.max``,
    ``cpu.cfs_quota_us``) and its cpuset, not the host's ``os.cpu_count()`` (Grain's
    default, which in a 2-CPU container on a 96-core host starts 96 workers)."""
    from dataloader.engine.pool.autoscale import usable_cpus

    return usable_cpus()


def inherited_options() -> DatasetOptions | None:
    """The dataset options of enclosing ``WithOptionsIterDataset`` calls, merged."""
    return _OPTIONS.get()


@contextlib.contextmanager
def workers(options: MultiprocessingOptions, init_fn: Any) -> Iterator[None]:
    token = _WORKERS.set((options, init_fn))
    try:
        yield
    finally:
        _WORKERS.reset(token)


@contextlib.contextmanager
def dataset_options(options: DatasetOptions) -> Iterator[None]:
    """Options for the datasets below; an outer call's options win over inner ones."""
    outer = _OPTIONS.get()
    token = _OPTIONS.set(options if outer is None else outer.merge(options))
    try:
        yield
    finally:
        _OPTIONS.reset(token)


def pipeline_options(ds: Any) -> DatasetOptions | None:
    """The options of every ``WithOptionsIterDataset`` in ``ds``'s pipeline, merged: one
    closer to the output wins over one further in (Grain's "the latest value takes
    precedence"), wherever they are."""
    merged: DatasetOptions | None = None
    seen: set[int] = set()
    queue = [ds]
    while queue:  # breadth first from the output: outer options are met first
        node = queue.pop(0)
        if id(node) in seen or not isinstance(node, IterDataset):
            continue
        seen.add(id(node))
        if isinstance(node, WithOptionsIterDataset):
            merged = node.options if merged is None else merged.merge(node.options)
        queue.extend(node.parents)
    return merged


@contextlib.contextmanager
def building(ds: Any) -> Iterator[None]:
    """Around the outermost ``iter(ds)``: the options of the whole pipeline reach every
    dataset whose iterator is built inside it, before and after its
    ``WithOptionsIterDataset`` (see :class:`~dataloader.dataset.base.IterDataset`)."""
    if _BUILDING.get():
        yield
        return
    token = _BUILDING.set(True)
    try:
        options = pipeline_options(ds)
        if options is None:
            yield
        else:
            with dataset_options(options):
                yield
    finally:
        _BUILDING.reset(token)


class WithOptionsIterDataset(IterDataset):
    """Grain's ``WithOptionsIterDataset``: ``parent`` run with ``options``.

    As in Grain, the options apply to the whole pipeline, the datasets before it and the
    calls chained after it (the engine-backed stream's filters and the iterator-level
    filters); options set closer to the output win.

    Example:
        >>> import dataloader as dl
        >>> ds = dl.MapDataset.range(3000).to_iter_dataset().filter(lambda x: x % 10 == 0)
        >>> strict = dl.experimental.WithOptionsIterDataset(
        ...     ds, dl.experimental.DatasetOptions(filter_raise_threshold_ratio=0.5))
        >>> list(strict)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: Transformation FilterTransform(<lambda>) skipped 90.00 % of the last seen 1000 elements, at or above filter_raise_threshold_ratio=0.5...
    """

    def __init__(self, parent: IterDataset, options: DatasetOptions) -> None:
        if not isinstance(options, DatasetOptions):
            raise TypeError(f"WithOptionsIterDataset needs DatasetOptions, got {options!r}")
        super().__init__(parent)
        self.options = options

    def __iter__(self) -> Any:
        with dataset_options(self.options):
            return iter(self._parent)

    def __repr__(self) -> str:
        return f"WithOptionsIterDataset({self._parent!r}, {self.options})"
