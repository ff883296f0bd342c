"""The one shape of ``stats()``: running totals, and the dict every iterator returns.

Every iterator keeps **totals**, counters that only grow::

    records_read   records read from the data source(s)
    elements_out   elements the operations made (after maps, filters and flat maps,
                   before the batch): the rows of the batches
    batches_out    batches handed out (0 when the pipeline does not batch)
    units          work units computed (a batch each, usually)
    wait_s         seconds the consumer spent inside next(), the first call excepted
    fetch_cpu_s    CPU seconds this process spent getting units (handing out tasks,
                   receiving results; without workers, the computing itself)
    pipe_units     units whose result came through a pipe, not shared memory
    stage_seconds  {stage: seconds}: "read", each operation by name, "batch",
                   "transport", iterator-level stages, "host_to_device"
    workers        {"0", "1", ..., "main": {"busy_s", "cpu_s", "units", "span_s"}}:
                   per worker process (by index; "main" is this process), the
                   seconds spent computing units, their CPU, how many, and the
                   seconds since its first unit

:func:`publish` turns totals into the public dict: the totals plus rates and shares
over the time since the first ``next()``, and the same over a rolling ``window`` (the
difference between the totals now and those of about ``WINDOW_S`` seconds ago, see
:class:`~dataloader.engine.stats.clock.History`). Because the window is a difference
of totals, it never disagrees with them.
"""

from __future__ import annotations

import copy
from typing import Any

COUNTS = ("records_read", "elements_out", "batches_out", "units", "pipe_units")
SECONDS = ("wait_s", "fetch_cpu_s")
MAIN = "main"  # the key of this process among the workers


def empty_totals() -> dict[str, Any]:
    """Totals of an iterator that has done nothing yet."""
    totals: dict[str, Any] = dict.fromkeys(COUNTS, 0)
    totals.update(dict.fromkeys(SECONDS, 0.0))
    totals["stage_seconds"] = {}
    totals["workers"] = {}
    return totals


def add_totals(into: dict[str, Any], other: dict[str, Any], prefix: str = "") -> None:
    """Adds ``other``'s totals to ``into``; worker keys get ``prefix`` (several engines)."""
    for key in (*COUNTS, *SECONDS):
        into[key] += other[key]
    stages = into["stage_seconds"]
    for name, secs in dict(other["stage_seconds"]).items():
        stages[name] = stages.get(name, 0.0) + secs
    workers = into["workers"]
    for name, entry in dict(other["workers"]).items():
        key = prefix + name
        if key in workers:
            mine = workers[key]
            for field, value in entry.items():
                mine[field] = max(mine[field], value) if field == "span_s" else mine[field] + value
        else:
            workers[key] = dict(entry)


def subtract(now: Any, then: Any) -> Any:
    """``now - then`` leaf by leaf (dicts recursively; keys missing in ``then`` count 0)."""
    if isinstance(now, dict):
        then = then if isinstance(then, dict) else {}
        return {k: subtract(v, then.get(k)) for k, v in now.items()}
    return now - (then or 0)


def _rates(totals: dict[str, Any], span: float) -> dict[str, Any]:
    """Totals (or a window's difference of them) with rates and shares over ``span`` s."""
    out = copy.deepcopy(totals)
    per = 1.0 / span if span > 0 else 0.0
    out["records_per_s"] = totals["records_read"] * per
    out["elements_per_s"] = totals["elements_out"] * per
    out["batches_per_s"] = totals["batches_out"] * per
    out["wait_share"] = min(1.0, totals["wait_s"] * per)
    for entry in out["workers"].values():
        entry["busy_share"] = min(1.0, entry["busy_s"] / entry["span_s"]) if entry["span_s"] > 0 else 0.0
    return out


def publish(
    totals: dict[str, Any],
    *,
    elapsed_s: float,
    active_s: float,
    first_next_s: float,
    window: tuple[dict[str, Any], float] | None,
    pipeline: dict[str, Any],
    queues: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The public ``stats()`` dict (see docs/tuning.md, "Where the time goes").

    Args:
        totals: the iterator's totals now.
        elapsed_s: seconds since the iterator was made.
        active_s: seconds since its first ``next()`` returned (rates and shares are over it).
        first_next_s: how long the first ``next()`` took (start-up, not in ``wait_s``).
        window: the totals of about ``WINDOW_S`` seconds ago and how long ago that
            was, or None (no snapshot yet: the window is everything).
        pipeline: what the pipeline is (source, workers, batch size ...), for advice.
        queues: queue depths right now (the device feed's), if any.
    """
    out = _rates(totals, active_s)
    out["elapsed_s"] = elapsed_s
    out["active_s"] = active_s
    out["first_next_s"] = first_next_s
    if window is None:
        recent, span = totals, active_s
    else:
        recent, span = subtract(totals, window[0]), window[1]
        # A worker with no unit in the window (retired, or not started) is left out.
        recent["workers"] = {k: v for k, v in recent["workers"].items() if v["units"] > 0}
        for entry in recent["workers"].values():
            entry["span_s"] = min(entry["span_s"], span)
    out["window"] = {"seconds": span, **_rates(recent, span)}
    out["pipeline"] = dict(pipeline)
    out["queues"] = dict(queues or {})
    return out


def sorted_stages(stats: dict[str, Any]) -> list[tuple[str, float]]:
    """The ``(stage, seconds)`` pairs of an iterator's ``stats()``, most time first.

    Example:
        >>> sorted_stages({"stage_seconds": {"read": 0.5, "batch": 1.5}})
        [('batch', 1.5), ('read', 0.5)]
    """
    return sorted(stats["stage_seconds"].items(), key=lambda kv: -kv[1])


def flatten(stats: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """The numbers of a ``stats()`` dict as one flat ``{"a/b/c": number}`` dict.

    What TensorBoard's ``add_scalar`` or a Prometheus gauge wants; text fields (the
    pipeline's source name ...) are left out.

    Example:
        >>> flatten({"records_read": 3, "stage_seconds": {"read": 0.5}, "pipeline": {"source": "x"}})
        {'records_read': 3, 'stage_seconds/read': 0.5}
    """
    flat: dict[str, float] = {}
    for key, value in stats.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, name + "/"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            flat[name] = value
    return flat
