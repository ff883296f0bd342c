"""Computes one work unit: read its records, apply the operations. Pure and process-free.

The same function runs in the training process (``worker_count=0``) and in worker
processes, which is what makes the output independent of the worker count.

Elements carry two tags while they flow: the local ``position`` they came from and
``sub``, their rank among that position's outputs (non-zero only after a flat map).
The tags key the random generators of random maps and let the loader say exactly where
the stream is. A batch is tagged with its first element's tags.

Errors. Whatever user code raises (an operation, a source's read) becomes a
:class:`~dataloader.errors.PipelineError` naming the operation, the record index and
the position, chained to the original: ``SystemExit`` (``sys.exit`` in a map) and other
``BaseException`` subclasses included, so user code never ends the training process.
The one exception is ``KeyboardInterrupt`` in the training process itself
(``worker_count=0``, warm-start units, regrouping): there it cannot be told apart
from a real Ctrl-C, which must interrupt the job, so it passes through unchanged.
Worker processes ignore SIGINT, so there a ``KeyboardInterrupt`` can only come from
user code, and it becomes a ``PipelineError`` like any other (``passthrough=()``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dataloader.engine import digest
from dataloader.engine.blame import blame_read
from dataloader.engine.plan import BATCH, Plan, Step
from dataloader.errors import PipelineError
from dataloader.operations import Operation
from dataloader.operations.transforms import KEEP, MANY, ONE
from dataloader.samplers import RecordRngFactory
from dataloader.sources import HintedDataSource, read_records


@dataclasses.dataclass
class UnitResult:
    """A unit's outputs, in order.

    Attributes:
        start, stop: the unit's range of local positions.
        outputs: the elements (``elements``/``regroup`` layouts) or batches (``batch``).
        positions: the local position of each output; ``None`` means
            ``start + arange(len(outputs))`` (nothing was filtered or expanded).
        subs: each output's rank among its position's outputs; ``None`` means all zero.
        timings: seconds spent on ``"read"``, ``"batch"`` and each operation (by name)
            while computing the unit, wherever it was computed; the pool adds
            ``"transport"``, the parent's seconds receiving the result.
        elements: how many elements the operations before the batch produced (the
            rows of the unit's batches); -1: unknown (``len(outputs)``).
        worker: the worker that computed the unit, -1 for this process (set by the pool).
        began, ended: when computing started and ended, ``time.monotonic()`` seconds,
            which every process of the machine reads from the same clock.
        cpu_s: CPU seconds the computing thread spent on the unit (below ``ended -
            began`` when it waited, on I/O for instance).
        piped: the result came through a pipe, not shared memory (set by the pool).
        sources, digests: with ``plan.fingerprint``, a digest of each record read
            (positions ``[start, stop)``) and of each output, computed where the unit
            was, so a state's fingerprint costs the training process no hashing
            (:mod:`~dataloader.engine.fingerprint`); None otherwise.
        error: the unit failed at position ``stop`` (its range was cut there): the
            outputs are those of the records before it, and this error (a worker's
            arrives as its pickled payload) is raised once they are handed out, so an
            error comes at its record's place whatever the unit sizes.
    """

    start: int
    stop: int
    outputs: list[Any]
    positions: np.ndarray | None = None
    subs: np.ndarray | None = None
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    elements: int = -1
    worker: int = -1
    began: float = 0.0
    ended: float = 0.0
    cpu_s: float = 0.0
    piped: bool = False
    error: Any = None
    sources: np.ndarray | None = None
    digests: np.ndarray | None = None

    def tags(self) -> tuple[np.ndarray, np.ndarray]:
        n = len(self.outputs)
        pos = self.positions if self.positions is not None else np.arange(self.start, self.start + n)
        sub = self.subs if self.subs is not None else np.zeros(n, dtype=np.int64)
        return pos, sub


# Reports the stage a unit is in: READ, then 1 + the operation's index in the pipeline
# (see stage_names). Called a few times per unit, never per record.
Report = Callable[[int], None]
READ = 0
# In the training process a KeyboardInterrupt may be a real Ctrl-C: let it through.
IN_PROCESS: tuple[type[BaseException], ...] = (KeyboardInterrupt,)


def call_user(what: str, where: Callable[[], str], fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, user code run in this process by a stage (a batch, a stream operation).

    A ``KeyboardInterrupt`` passes (it may be a real Ctrl-C); any other error, ``SystemExit``
    too (user code never ends the job), becomes a :class:`PipelineError` saying that
    ``what`` failed ``where()`` (made only on failure).
    """
    try:
        return fn(*args)
    except IN_PROCESS:
        raise
    except BaseException as exc:
        raise PipelineError(
            f"{what} failed {where()}: {type(exc).__name__}: {exc}", operation=what
        ) from exc


def stage_names(plan: Plan) -> list[str]:
    """The name of each stage number a :data:`Report` receives."""
    return ["read", *plan.operation_names]


def record_index(plan: Plan, position: int) -> int:
    """The source index of the record at a local position (for error messages)."""
    return int(unit_record_keys(plan, position, position + 1)[0])


def unit_record_keys(plan: Plan, start: int, stop: int) -> np.ndarray:
    """The source indices of the records at local positions ``[start, stop)``."""
    return plan.sampler.record_keys(np.arange(start, stop, dtype=np.int64))


def hint_unit(plan: Plan, start: int, stop: int) -> None:
    """Tells the source which records a coming unit ``[start, stop)`` will read.

    Only a source that takes hints (:class:`~dataloader.sources.HintedDataSource` with
    ``takes_hints``: a remote ArrayRecord source) hears it, and starts fetching them in
    the background; for any other (local files) nothing is computed, not even the
    records' indices. A hint never blocks for long nor fails a unit: whatever it raises
    is dropped (the unit's own read reports a real problem, at its record). Positions
    past the stream's end are cut off.
    """
    source = plan.source
    if not (isinstance(source, HintedDataSource) and source.takes_hints):
        return
    if plan.num_positions is not None:
        stop = min(stop, plan.num_positions)
    if stop <= start:
        return
    with contextlib.suppress(Exception):
        source.prefetch(unit_record_keys(plan, start, stop))


def _fail(plan: Plan, what: str, position: int, sub: int, exc: BaseException) -> PipelineError:
    key = record_index(plan, position)
    where = f"record {key} (position {position}" + (f", output {sub}" if sub else "") + ")"
    return PipelineError(
        f"{what} failed on {where}: {type(exc).__name__}: {exc}",
        operation=what,
        record_index=key,
        position=position,
    )


def _ranks(positions: np.ndarray) -> np.ndarray:
    """Rank of each entry within its run of equal (contiguous) positions."""
    if positions.size == 0:
        return positions.copy()
    idx = np.arange(positions.size, dtype=np.int64)
    starts = np.empty(positions.size, dtype=bool)
    starts[0] = True
    np.not_equal(positions[1:], positions[:-1], out=starts[1:])
    return idx - np.maximum.accumulate(np.where(starts, idx, 0))


# Builds the error for an element operation that raised: (operation, position, sub, error).
Fail = Callable[[Operation, int, int, BaseException], BaseException]


def apply_element_ops(
    steps: Sequence[Step],
    elements: list[Any],
    positions: np.ndarray | None,
    subs: np.ndarray | None,
    start: int,
    fail: Fail,
    *,
    rng_keys: Callable[[np.ndarray], np.ndarray] | None = None,
    rngs: dict[int, RecordRngFactory] | None = None,
    timings: dict[str, float] | None = None,
    report: Report | None = None,
    passthrough: tuple[type[BaseException], ...] = IN_PROCESS,
) -> tuple[list[Any], np.ndarray | None, np.ndarray | None]:
    """Applies a run of element operations, keeping the tags in step with the elements.

    The one interpreter of element operations: the worker (:func:`compute_unit`), the
    parent (the operations after a regrouped batch) and the iterator-level stages
    (:mod:`.stages.elementwise`) call it. It reads what each operation declares
    (``returns``, ``needs_seed``, ``needs_index``), never its class.

    Args:
        steps: the operations, with their stream numbers and seeds.
        elements: the input elements.
        positions, subs: their tags; ``None``: ``start + arange(n)`` and all zero.
        start: the position of the first element when ``positions`` is ``None``.
        fail: makes the error raised for an operation that raised on an element.
        rng_keys: maps positions to the keys of the per-element generators (the
            sampler's global positions); ``None``: the positions themselves.
        rngs: a cache of generator factories by stream number (a stage keeps one
            across calls); ``None``: made for this call.
        timings: adds the seconds each operation took (two clock reads per operation
            per call, nothing per element).
        report: hears each operation's stage number as it starts.
        passthrough: exceptions raised as they are; every other one goes to ``fail``.
    """
    if rngs is None:
        rngs = {}
    for step in steps:
        if report is not None:
            report(1 + step.stream)
        op, fn = step.op, step.fn
        if not elements:  # all filtered out: nothing to do, nothing to time
            if timings is not None:
                timings.setdefault(op.name, 0.0)
            continue
        began = time.perf_counter() if timings is not None else 0.0
        out: list[Any] = []
        append = out.append
        try:
            if op.needs_seed:
                keys: Any = range(start, start + len(elements))  # no tags: the positions
                if rng_keys is not None or positions is not None:
                    pos = positions if positions is not None else np.arange(start, start + len(elements))
                    keys = (rng_keys(pos) if rng_keys is not None else pos).tolist()
                sub = [0] * len(elements) if subs is None else subs.tolist()
                # One reusable generator per operation, reset for each element.
                factory = rngs.get(step.stream)
                if factory is None:
                    factory = rngs[step.stream] = RecordRngFactory(step.seed, step.stream)
                for x, g, s in zip(elements, keys, sub):
                    append(fn(x, factory(g, s)))
            elif op.needs_index:
                pos = positions if positions is not None else np.arange(start, start + len(elements))
                for x, i in zip(elements, pos.tolist()):
                    append(fn(i, x))
            elif op.returns == MANY:
                for x in elements:
                    append(op.checked_flat_map(x))
            elif op.returns == KEEP:
                for x in elements:
                    append(bool(fn(x)))
            else:
                for x in elements:
                    append(fn(x))
        except passthrough:
            raise
        except BaseException as exc:
            i = len(out)
            pos_i = int(positions[i]) if positions is not None else start + i
            sub_i = int(subs[i]) if subs is not None else 0
            raise fail(op, pos_i, sub_i, exc) from exc
        # Without tags (positions None: start + arange) an operation that keeps every
        # element, or turns each into one, leaves them None: the iterator-level stages
        # call this for one element at a time, where building arrays would cost most.
        if op.returns == ONE:
            elements = out
        elif positions is None and op.returns == KEEP and all(out):
            pass
        elif positions is None and op.returns == KEEP and not any(out):
            elements, positions = [], np.empty(0, dtype=np.int64)
        elif positions is None and op.returns == MANY and all(len(o) == 1 for o in out):
            elements = [o[0] for o in out]
        else:
            if positions is None:
                positions = np.arange(start, start + len(elements), dtype=np.int64)
            if op.returns == KEEP:
                keep = np.fromiter(out, dtype=bool, count=len(out))
                elements = [x for x, k in zip(elements, out) if k]
                positions = positions[keep]
                subs = subs[keep] if subs is not None else None
            else:
                counts = np.fromiter((len(o) for o in out), dtype=np.int64, count=len(out))
                elements = [y for o in out for y in o]
                positions = np.repeat(positions, counts)
                subs = _ranks(positions)
        if timings is not None:
            timings[op.name] = timings.get(op.name, 0.0) + time.perf_counter() - began
    return elements, positions, subs


def apply_steps(
    plan: Plan,
    steps: tuple[Step, ...],
    elements: list[Any],
    positions: np.ndarray | None,
    subs: np.ndarray | None,
    start: int,
    timings: dict[str, float],
    report: Report | None = None,
    passthrough: tuple[type[BaseException], ...] = IN_PROCESS,
) -> tuple[list[Any], np.ndarray | None, np.ndarray | None]:
    """:func:`apply_element_ops` on a plan's positions: generators keyed by the sampler's
    global positions, errors naming the record."""

    def fail(op: Operation, position: int, sub: int, exc: BaseException) -> BaseException:
        return _fail(plan, op.name, position, sub, exc)

    return apply_element_ops(
        steps, elements, positions, subs, start, fail, rng_keys=plan.sampler.global_positions,
        timings=timings, report=report, passthrough=passthrough,
    )


def compute_unit(
    plan: Plan,
    start: int,
    stop: int,
    report: Report | None = None,
    passthrough: tuple[type[BaseException], ...] = IN_PROCESS,
    read: Read | None = None,
) -> UnitResult:
    """Reads and transforms the records at local positions ``[start, stop)``.

    ``report`` and ``passthrough`` are as in :func:`apply_steps`; a worker passes its
    progress slot and ``passthrough=()``. ``read``: the records, already read ahead
    (:class:`Read`), else the unit reads them itself.

    A record that fails at position ``p`` inside the unit: the unit is computed again up
    to ``p`` (only on this failure path) and returned cut there, carrying the error
    (:attr:`UnitResult.error`), so the records before ``p`` are handed out and the error
    comes at ``p`` however the stream was cut into units. A batch unit fails whole.
    """
    try:
        return _compute_unit(plan, start, stop, report, passthrough, read)
    except PipelineError as exc:
        failed_at = exc.position
        if plan.layout == BATCH or failed_at is None or not start < failed_at < stop:
            raise
        # Read again, not from ``read``: a map may have changed its records in place.
        before = _compute_unit(plan, start, failed_at, report, passthrough)
        before.error = exc
        return before


@dataclasses.dataclass(frozen=True)
class Read:
    """A unit's records, read before it is computed (by read-ahead threads), and the
    seconds the computing thread waited for them."""

    records: list[Any]
    seconds: float


def _compute_unit(
    plan: Plan,
    start: int,
    stop: int,
    report: Report | None,
    passthrough: tuple[type[BaseException], ...],
    read: Read | None = None,
) -> UnitResult:
    if report is not None:
        report(READ)
    # For stats(): when (for timelines across processes) and how much CPU, four clock
    # reads per unit.
    wall, cpu = time.monotonic(), time.thread_time()
    began = time.perf_counter()
    if read is not None:
        records, timings = read.records, {"read": read.seconds}
    else:
        keys = unit_record_keys(plan, start, stop)
        try:
            records = read_records(plan.source, keys)
        except passthrough:
            raise
        except BaseException as exc:
            # Which record is unreadable? The batched call cannot say; reading the unit's
            # records one by one can (only on this failure path).
            error, cause = blame_read(plan.source, keys, start, exc, passthrough)
            raise error from cause
        timings = {"read": time.perf_counter() - began}
    # Before the operations: a map may change its record in place.
    sources = digest.digests(records) if plan.fingerprint else None
    elements, positions, subs = apply_steps(
        plan, plan.pre, list(records), None, None, start, timings, report, passthrough
    )
    outputs = elements
    if plan.layout == BATCH:
        assert plan.batch is not None
        outputs, positions, subs = batch_and_post(
            plan, elements, start, 0, timings, report, passthrough
        )
    digests = digest.digests(outputs) if plan.fingerprint else None
    return UnitResult(
        start, stop, outputs, positions, subs, timings, elements=len(elements), began=wall,
        ended=time.monotonic(), cpu_s=time.thread_time() - cpu, sources=sources, digests=digests,
    )


def batch_and_post(
    plan: Plan,
    elements: list[Any],
    position: int,
    sub: int,
    timings: dict[str, float],
    report: Report | None = None,
    passthrough: tuple[type[BaseException], ...] = IN_PROCESS,
) -> tuple[list[Any], np.ndarray | None, np.ndarray | None]:
    """Stacks elements into one batch and applies the operations after the batch.

    Returns the outputs (usually one batch) and their tags: ``None`` tags when there
    are no operations after the batch.
    """
    assert plan.batch is not None
    if report is not None:
        report(1 + len(plan.pre))
    began = time.perf_counter()
    try:
        batch = plan.batch.batch_fn(elements)
    except passthrough:
        raise
    except BaseException as exc:
        raise _fail(plan, plan.batch.name, position, sub, exc) from exc
    timings["batch"] = timings.get("batch", 0.0) + time.perf_counter() - began
    if not plan.post:
        return [batch], None, None
    return apply_steps(
        plan,
        plan.post,
        [batch],
        np.asarray([position], dtype=np.int64),
        np.asarray([sub], dtype=np.int64),
        position,
        timings,
        report,
        passthrough,
    )
