"""``stats()`` in one line of text: for the progress bar, and a periodic log line.

Example:
    >>> import dataloader as dl
    >>> it = iter(dl.DataLoader(dl.RangeDataSource(64), dl.SequentialSampler(64), [dl.Batch(8)]))
    >>> it.add_stats_hook(dl.log_stats, every_s=60)   # an absl log line every minute
    >>> _ = list(it)
"""

from __future__ import annotations

from typing import Any

from dataloader.engine.stats.shape import sorted_stages


def slowest_stage(stats: dict[str, Any]) -> tuple[str, float] | None:
    """The stage with the most seconds and its share of all stages' seconds."""
    stages = sorted_stages(stats)
    total = sum(secs for _, secs in stages)
    if not stages or total <= 0:
        return None
    name, secs = stages[0]
    return name, secs / total


def summary_line(stats: dict[str, Any], *, window: bool = True) -> str:
    """Records/s, batches/s, the consumer's waiting and the slowest stage, in one line.

    Args:
        stats: a ``stats()`` dict.
        window: describe the last seconds (``stats["window"]``) rather than the totals.
    """
    part = stats["window"] if window else stats
    parts = [f"{part['records_per_s']:,.0f} records/s"]
    if part["batches_out"]:
        parts.append(f"{part['batches_per_s']:,.1f} batches/s")
    elif part["elements_out"]:
        parts.append(f"{part['elements_per_s']:,.0f} elements/s")
    parts.append(f"waiting {part['wait_share']:.0%}")
    slowest = slowest_stage(part)
    if slowest is not None:
        parts.append(f"slowest {slowest[0]} {slowest[1]:.0%}")
    return ", ".join(parts)


def computed_by(pipeline: dict[str, Any]) -> tuple[str, str, str]:
    """Who computes the units, for a run's summary, as (what, how many, a note):
    ``("worker processes", "2", "")`` (``"0"``: this process), ``("Ray actors", "3",
    "1 on this node")`` with a ``RayExecutor``, or ``("executor MyExecutor", "?", "")``
    for an executor that does not describe itself.

    Args:
        pipeline: ``stats()["pipeline"]``.
    """
    executor = pipeline.get("executor") or {}
    kind = executor.get("kind", "pool")
    if kind == "ray":
        local = executor.get("local_actors")
        return "Ray actors", str(executor.get("actors", "?")), f"{local} on this node" if local else ""
    if kind in ("pool", "in_process"):
        return "worker processes", str(pipeline.get("worker_count", "?")), ""
    return f"executor {kind}", "?", ""


def log_stats(stats: dict[str, Any]) -> None:
    """A stats hook that logs :func:`summary_line` through absl (INFO).

    Give it to ``iterator.add_stats_hook(dl.log_stats, every_s=60)`` for a line in a
    training job's log every minute.
    """
    from absl import logging

    logging.info("granary: %s", summary_line(stats))
