"""The fingerprint check on restore: a state's last step read again, and compared.

A state's fingerprint (:mod:`dataloader.engine.fingerprint`) names its last step's
records and digests what they read and what the operations made of them. A restore
reads that step again and refuses the state when either differs (a data file rewritten
under the same name, a changed map or tokenizer):

* in this process (:func:`verify`), when the loader computes in this process;
* with workers, never in this process (docs/design.md, "Where user code runs"): on the
  stream's executor, whose units from the restored position on go on into the stream
  (:func:`check_on_stream`), or on an executor of its own (:func:`verify_on_executor`);
* an elastic restore checks each old host's last step once across the new hosts
  (:func:`verify_share`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from dataloader.engine.assemble import from_position
from dataloader.engine.compute import apply_element_ops
from dataloader.engine.digest import combine, digests
from dataloader.engine.fingerprint import global_positions, record_keys, unpack_sources
from dataloader.engine.plan import BATCH, Plan
from dataloader.engine.restore.samplers import StepSampler, order_of
from dataloader.errors import PipelineError, StateMismatchError
from dataloader.sources import read_records

# Records named in a refusal; more are counted, not listed.
_SHOWN = 8


def _keep_undropped(fingerprint: dict[str, Any], pos: np.ndarray, subs: np.ndarray, shift: int = 0) -> np.ndarray:
    """Which of the outputs tagged ``(pos, subs)`` the saved step did not drop
    (``shift``: added to the saved positions to give ``pos``'s)."""
    keep = np.ones(len(pos), dtype=bool)
    for q, sub in fingerprint.get("dropped", ()):
        keep &= ~((pos == q + shift) & (subs == sub))
    return keep


def _shown(keys: Sequence[int]) -> str:
    listed = ", ".join(str(int(k)) for k in keys[:_SHOWN])
    return listed + (f" and {len(keys) - _SHOWN} more" if len(keys) > _SHOWN else "")


def recompute(plan: Plan, fingerprint: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, str]:
    """Reads a fingerprint's records again and recomputes its step, in this process.

    Returns:
        The record indices, their source digests (uint64) and the output digest.
    """
    count, local_start = fingerprint["count"], fingerprint["local_start"]
    glob = global_positions(fingerprint)
    keys = record_keys(plan, fingerprint)
    records = read_records(plan.source, keys)
    sources = digests(records)

    def rng_keys(positions: np.ndarray) -> np.ndarray:
        # The saved shard's local positions back to global ones: random maps draw the
        # same numbers on any host count.
        return glob[np.asarray(positions, dtype=np.int64) - local_start]

    def fail(op: Any, position: int, sub: int, exc: BaseException) -> BaseException:
        key = int(keys[position - local_start]) if 0 <= position - local_start < count else -1
        return PipelineError(
            f"{op.name} failed on record {key} while the restore re-read the state's last "
            f"step: {type(exc).__name__}: {exc}",
            operation=op.name, record_index=key, position=position,
        )

    elements, pos, subs = apply_element_ops(plan.pre, list(records), None, None, local_start, fail, rng_keys=rng_keys)
    if "output_index" in fingerprint:
        assert plan.batch is not None and plan.layout == BATCH
        outputs: list[Any] = [plan.batch.batch_fn(elements)]
        if plan.post:
            one = np.asarray([local_start], dtype=np.int64)
            outputs, _, _ = apply_element_ops(
                plan.post, outputs, one, np.zeros(1, dtype=np.int64), local_start, fail, rng_keys=rng_keys
            )
        index = fingerprint["output_index"]
        output = combine(digests(outputs[index : index + 1]))
        return keys, sources, output
    n = len(elements)
    pos = pos if pos is not None else np.arange(local_start, local_start + n, dtype=np.int64)
    subs = subs if subs is not None else np.zeros(n, dtype=np.int64)
    p0, s0, p1, s1 = fingerprint["select"]
    keep = ((pos > p0) | ((pos == p0) & (subs >= s0))) & ((pos < p1) | ((pos == p1) & (subs <= s1)))
    keep &= _keep_undropped(fingerprint, pos, subs)
    chosen = [x for x, k in zip(elements, keep.tolist()) if k]
    return keys, sources, combine(digests(chosen))


def verify(plan: Plan, fingerprint: dict[str, Any]) -> None:
    """Re-reads the state's last step and refuses a restore whose data or operations
    changed since the state was saved.

    Raises:
        StateMismatchError: naming the records whose source bytes differ, or saying that
            the operations' output differs (the records read the same).
    """
    _, sources, output = recompute(plan, fingerprint)
    compare(plan, fingerprint, sources, output)


def compare(plan: Plan, fingerprint: dict[str, Any], sources: np.ndarray, output: str) -> None:
    """Refuses a restore whose recomputed step (its records' ``sources`` digests and its
    ``output`` digest, computed wherever) differs from the saved ``fingerprint``.

    Raises:
        StateMismatchError: as :func:`verify`.
    """
    keys = record_keys(plan, fingerprint)
    saved = unpack_sources(fingerprint["sources"])
    changed = np.flatnonzero(sources.astype(np.uint32) != saved)
    step = fingerprint.get("step")
    which = f"step {step}" if step is not None else "the last step"
    undo = (
        "restore the data and code the state was saved with, start from scratch, or pass "
        "verify_on_restore=False to the DataLoader to resume anyway"
    )
    if changed.size:
        raise StateMismatchError(
            f"the state's fingerprint does not match the data: the source bytes of "
            f"record{'s' if changed.size > 1 else ''} {_shown(keys[changed].tolist())} "
            f"({changed.size} of the {len(keys)} records of {which}) differ from when the "
            f"state was saved (a data file rewritten under the same name?); {undo}"
        )
    if output != fingerprint["output"]:
        raise StateMismatchError(
            f"the state's fingerprint does not match the pipeline: the {len(keys)} records "
            f"of {which} ({_shown(keys.tolist())}) read the same bytes, but the operations' "
            f"output differs (output digest {output}, saved {fingerprint['output']}): a "
            f"changed map, filter, tokenizer or batch function?; {undo}"
        )


def covering(units: Iterator[Any], start: int, count: int) -> list[Any]:
    """Unit results from ``units`` (an executor reset to ``start``) until they cover
    positions ``[start, start + count)``: what the check reads. An error of a record in
    that range is raised (it names the record and operation); a later one stays with its
    unit, for the stream to raise where it comes."""
    got: list[Any] = []
    while not got or got[-1].stop < start + count:
        try:
            r = next(units)
        except StopIteration:
            break
        if r.error is not None and r.stop < start + count:
            raise r.error
        got.append(r)
    return got


def from_units(fingerprint: dict[str, Any], units: Sequence[Any], start: int) -> tuple[np.ndarray, str]:
    """The source digests and the output digest of a fingerprint's step, from the unit
    results that computed it wherever they were computed (worker processes).

    Args:
        units: consecutive unit results from ``start`` on, with digests, covering the
            step's ``count`` positions (:func:`covering`).
        start: the units' position of the step's first record: the saved
            ``local_start`` on the stream the state was saved on, 0 on a
            :class:`StepSampler`'s.

    Raises:
        StateMismatchError: the stream ends before the step's last record.
    """
    count = fingerprint["count"]
    lo, hi = start, start + count
    parts = [r.sources[max(lo, r.start) - r.start : min(hi, r.stop) - r.start] for r in units if r.start < hi and r.stop > lo]
    sources = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)
    if len(sources) != count:
        raise StateMismatchError(
            f"the state's fingerprint names {count} records from position {fingerprint['local_start']}, "
            f"but the stream holds {len(sources)} of them: the data set shrank?; restore the "
            f"data the state was saved with, or pass verify_on_restore=False to resume anyway"
        )
    if "output_index" in fingerprint:  # a batch unit is the step's whole range
        index = fingerprint["output_index"]
        return sources, combine(units[0].digests[index : index + 1])
    shift = start - fingerprint["local_start"]
    p0, s0, p1, s1 = fingerprint["select"]
    p0, p1 = p0 + shift, p1 + shift
    chosen = []
    for r in units:
        pos, subs = r.tags()
        keep = ((pos > p0) | ((pos == p0) & (subs >= s0))) & ((pos < p1) | ((pos == p1) & (subs <= s1)))
        keep &= _keep_undropped(fingerprint, pos, subs, shift)
        chosen.append(np.asarray(r.digests)[np.asarray(keep, dtype=bool)])
    return sources, combine(np.concatenate(chosen))


def verify_on_executor(engine: Any, fingerprints: Sequence[dict[str, Any]]) -> None:
    """:func:`verify` of each fingerprint, with the steps computed by one new executor
    of ``engine``'s kind (worker processes: no user code runs in this process) over a
    :class:`StepSampler` of their records one after the other.

    Raises:
        StateMismatchError: as :func:`verify`, for the first fingerprint that differs.
    """
    from dataloader.engine.restore.relayout import with_sampler

    plan = engine.plan
    counts = [fp["count"] for fp in fingerprints]
    if plan.layout == BATCH and len(set(counts)) > 1:  # a batch unit is one step: one size each
        for fp in fingerprints:
            verify_on_executor(engine, [fp])
        return
    if not fingerprints:
        return
    offsets = np.cumsum([0, *counts]).tolist()
    positions = np.concatenate([global_positions(fp) for fp in fingerprints])
    sampler = StepSampler(order_of(plan.sampler), positions)
    # A batch unit is the saved step's batch, whatever this loader's batch size;
    # fingerprint=True: the units carry digests even where states do not.
    size = counts[0] if plan.layout == BATCH else plan.unit_size
    check = dataclasses.replace(engine, plan=dataclasses.replace(plan, unit_size=size, fingerprint=True))
    executor = with_sampler(check, sampler).make_executor(0)
    try:
        units = covering(executor, 0, offsets[-1])
    finally:
        executor.close()
    for fp, start in zip(fingerprints, offsets):
        stop = start + fp["count"]
        sources, output = from_units(fp, [r for r in units if r.start < stop and r.stop > start], start)
        compare(plan, fp, sources, output)


def check_on_stream(engine: Any, home: Any, fp: dict[str, Any], cursor: Any, executor: Any) -> tuple[Any, list[Any] | None]:
    """The fingerprint check with workers, on the stream the restore goes on with.

    The executor (``executor``, reset, or a new one of ``engine``'s when None) starts at
    the step's first position and its workers compute the step's units with their
    digests; the units from ``cursor`` on are kept for the stream, so the check costs
    about one unit and the stream goes on as if restored directly. A step that is not a
    run of this stream's positions (a state of another host count) is computed by an
    executor of its own (:func:`verify_on_executor`, on ``home``).

    Returns:
        The executor the stream goes on with (None: make one at the cursor), and its
        units from the cursor on, or None when the stream is to be computed from the
        cursor (the executor reset there): a cursor past the checked units, or inside
        a batch unit (not on its grid). Units past the checked ones are not pulled: one
        of them may hold an error the state steps over.

    Raises:
        StateMismatchError: as :func:`verify`. An executor made here is closed first.
    """
    plan, start, count = engine.plan, fp["local_start"], fp["count"]
    try:
        here = plan.sampler.global_positions(np.arange(start, start + count, dtype=np.int64))
        own = plan.fingerprint and np.array_equal(here, global_positions(fp))
    except IndexError:  # beyond this stream's end
        own = False
    if not own:
        verify_on_executor(home, [fp])
        return executor, None
    made = executor is None
    if made:
        executor = engine.make_executor(start)
    else:
        executor.reset(start)
    try:
        units = covering(executor, start, count)
        sources, output = from_units(fp, units, start)
        compare(plan, fp, sources, output)
    except BaseException:
        if made:  # a refused construction leaves no workers up
            executor.close()
        raise
    starts = [r.start for r in units]
    if cursor.position in starts:
        return executor, units[starts.index(cursor.position):]
    if units and units[-1].stop == cursor.position and units[-1].error is None:
        return executor, []
    if plan.layout != BATCH:  # the cursor inside a unit (sizing cuts anywhere): its rest
        inside = [i for i, r in enumerate(units) if r.start < cursor.position < r.stop]
        if inside:
            return executor, [from_position(units[inside[0]], cursor.position), *units[inside[0] + 1 :]]
    return executor, None


def verify_share(home: Any, fingerprints: Sequence[dict[str, Any] | None]) -> None:
    """An elastic restore's check of the old hosts' last steps: new host ``j`` of ``H'``
    checks the fingerprints of old states ``j, j + H', ...`` (``fingerprints``, one per
    old state, None where it has none), so each is checked once across the new hosts,
    about one batch per host; with workers all on one executor of their own."""
    if not home.verify_on_restore:
        return
    shards = home.plan.sampler.shard_options
    share = [fp for fp in list(fingerprints)[shards.shard_index :: shards.shard_count] if fp is not None]
    if home.in_workers:  # user code in workers only
        verify_on_executor(home, share)
    else:
        for fp in share:
            verify(home.plan, fp)
