"""Naming the record behind a failure the failing call cannot name itself.

Two such failures, both looked into only once they happened (nothing here runs on the
path of a unit that succeeds):

* A batched read (``__getitems__``) fails for the whole unit: the reader's message
  (e.g. ArrayRecord's "chunk data hash mismatch") says what is wrong, not which of the
  unit's records it is. :func:`blame_read` reads the records one by one and names
  each that fails, with its file where the source says (``record_location``).
* A worker's result does not pickle (a lambda, a generator, an open file): pickle says
  which type, not which record or where in it. :func:`unpicklable_result` pickles the
  unit's outputs one by one and walks the first that fails down to the part that
  does not pickle; for a batch, it computes the unit's elements again to name the
  element (the record) that holds it.
"""

from __future__ import annotations

import pickle
from typing import TYPE_CHECKING, Any

import numpy as np

from dataloader.errors import PipelineError

if TYPE_CHECKING:
    from dataloader.engine.compute import UnitResult
    from dataloader.engine.plan import Plan

_SHOWN = 8  # record indices listed in a message before "..."


def _listed(keys: list[int]) -> str:
    return f"{keys[:_SHOWN]}{'...' if len(keys) > _SHOWN else ''}"


def _where(source: Any, key: int) -> str:
    """`` in <location>`` when the source can say where record ``key`` lives."""
    locate = getattr(source, "record_location", None)
    if locate is None:
        return ""
    try:
        return f" in {locate(key)}"
    except Exception:  # a location is a courtesy; never hide the real error behind it
        return ""


def blame_read(
    source: Any,
    keys: np.ndarray,
    start: int,
    exc: BaseException,
    passthrough: tuple[type[BaseException], ...],
) -> tuple[PipelineError, BaseException]:
    """The error for a failed read of the records ``keys`` (positions from ``start``).

    Reads each record alone; the first that fails is named with its position, its
    location and the reader's own message, and the others that fail are listed. If
    every record reads alone, the batched failure is reported for the whole unit.
    Exceptions of the ``passthrough`` types (a Ctrl-C) are raised as they are.

    Returns:
        The error to raise and the exception to chain it to.
    """
    key_list = [int(k) for k in keys.tolist()]
    failures: list[tuple[int, int, BaseException]] = []
    for offset, key in enumerate(key_list):
        try:
            source[key]
        except passthrough:
            raise
        except BaseException as single:
            failures.append((offset, key, single))
    if not failures:
        return (
            PipelineError(
                f"reading records {_listed(key_list)} from {source!r} failed: "
                f"{type(exc).__name__}: {exc} (each record reads fine on its own)",
                operation="read",
                record_index=key_list[0] if key_list else None,
                position=start,
            ),
            exc,
        )
    offset, key, first = failures[0]
    others = [k for _, k, _ in failures[1:]]
    more = f"; records {_listed(others)} of the same unit fail too" if others else ""
    return (
        PipelineError(
            f"reading record {key} (position {start + offset}){_where(source, key)} from "
            f"{source!r} failed: {type(first).__name__}: {first}{more}; repair or rewrite "
            f"the data, or leave the record out of the sampler",
            operation="read",
            record_index=key,
            position=start + offset,
        ),
        first,
    )


def _unpicklable_part(obj: Any, path: str = "") -> tuple[str, Any, Exception] | None:
    """The innermost part of ``obj`` that does not pickle: (path, part, error), or None."""
    try:
        pickle.dumps(obj, protocol=5)
    except Exception as exc:
        if isinstance(obj, dict):
            children: list[tuple[str, Any]] = [(f"{path}[{k!r}]", v) for k, v in obj.items()]
        elif isinstance(obj, (list, tuple)):
            children = [(f"{path}[{i}]", v) for i, v in enumerate(obj)]
        elif isinstance(obj, np.ndarray) and obj.dtype == object:
            children = [(f"{path}[{', '.join(map(str, i))}]", obj[i]) for i in np.ndindex(obj.shape)]
        elif hasattr(obj, "__dict__") and not callable(obj):
            children = [(f"{path}.{k}", v) for k, v in vars(obj).items()]
        else:
            children = []
        for child_path, child in children:
            found = _unpicklable_part(child, child_path)
            if found is not None:
                return found
        return path, obj, exc
    return None


def _element_behind(plan: Plan, start: int, stop: int) -> tuple[int, str, Any, Exception] | None:
    """Which element of a batch holds the part that does not pickle.

    A batch no longer says which of its elements a part came from (a custom
    ``batch_fn`` may nest them any way), so the unit's elements before the batch are
    computed again (a unit is a pure function of its positions; user code runs twice
    for this unit, on this failure path only) and pickled one by one.

    Returns:
        (position, path, part, error) of the first element that does not pickle; None
        when each does (the ``batch_fn`` or an operation after it made the part), or
        when computing the unit again fails.
    """
    from dataloader.engine.compute import apply_steps, unit_record_keys
    from dataloader.sources import read_records

    try:
        records = read_records(plan.source, unit_record_keys(plan, start, stop))
        elements, positions, _ = apply_steps(plan, plan.pre, list(records), None, None, start, {}, None, ())
    except Exception:  # code that fails only the second time: name the batch as a whole
        return None
    for i, element in enumerate(elements):
        found = _unpicklable_part(element)
        if found is not None:
            return (int(positions[i]) if positions is not None else start + i, *found)
    return None


def unpicklable_result(plan: Plan, result: UnitResult, exc: BaseException) -> PipelineError:
    """The error for a unit result a worker could not pickle, naming record and type.

    For a batch, the record named is the one whose element holds the part that does not
    pickle (see :func:`_element_behind`), else the batch's first.
    """
    from dataloader.engine.compute import record_index
    from dataloader.engine.plan import BATCH

    positions, _ = result.tags()
    index, found = 0, None
    for i, output in enumerate(result.outputs):
        found = _unpicklable_part(output)
        if found is not None:
            index = i
            break
    path, part, error = found if found is not None else ("", result, exc)
    position = int(positions[index]) if len(positions) else result.start
    key = record_index(plan, position)
    producer = plan.pre[-1].op.name if plan.pre else "read"
    behind = _element_behind(plan, result.start, result.stop) if plan.layout == BATCH else None
    if behind is not None:
        position, path, part, error = behind
        key = record_index(plan, position)
        operation = producer
        what = (
            f"the batch of positions [{result.start}, {result.stop}) after {plan.operation_names[-1]}: "
            f"its element of record {key} (position {position}) after {producer}"
        )
    elif plan.layout == BATCH:
        operation = plan.operation_names[-1]
        what = f"the batch of positions [{result.start}, {result.stop}) (first record {key}) after {operation}"
    else:
        operation = producer
        what = f"the element of record {key} (position {position}) after {operation}"
    inside = f" at {path}" if path else ""
    return PipelineError(
        f"{what} cannot be sent to the training process: it holds a "
        f"{type(part).__name__}{inside}, which does not pickle ({type(error).__name__}: "
        f"{error}). Results cross processes only when worker_count > 0: return numpy "
        f"arrays, numbers, str or bytes (in dicts, lists or tuples), or use worker_count=0",
        operation=operation,
        record_index=key,
        position=position,
    )
