"""``stats()`` of a chain of iterators: the engines' totals plus each stage's own time.

An iterator-level stage (packing, a map after it, a user's ``DatasetIterator``, the
device feed) answers ``stats()`` with the totals of the iterators under it (added up
when there are several, e.g. a mixture of loaders; worker keys are then prefixed with
the parent's number, ``"1/0"``), plus:

* its own seconds under its name in ``stage_seconds``: its time in ``next()`` minus
  that of its parents called from the same thread (see :mod:`.clock`);
* the counts of what it hands out: a stage that makes batches (``stats_batches =
  True``, e.g. ``batch()``) counts its outputs as ``batches_out`` and its parent's
  outputs as ``elements_out``; one that makes elements (``False``, a packer) counts its
  outputs as ``elements_out``; the rest (``None``) hand out what their parent does; a
  stream with no parent (a Parquet or TFRecord stream) counts its outputs as records
  read too;
* ``wait_s``: the time its own caller spent in its ``next()``.

What an iterator provides to take part is written down once, in
:class:`~dataloader.engine.stats.protocol.StatsParticipant`; the functions here take
participants and skip, among their parents, the iterators that are not.
"""

from __future__ import annotations

import time
from typing import Any

from dataloader.engine.stats.clock import Clock
from dataloader.engine.stats.protocol import StatsParticipant
from dataloader.engine.stats.shape import add_totals, empty_totals, publish


def clock_of(it: StatsParticipant) -> Clock:
    """The iterator's clock, made on first use (user iterators need not make one); it
    times every call if the class says ``stats_exact = True``, whichever use comes first."""
    clock = it.stats_clock
    if clock is None:
        clock = it.stats_clock = Clock(_totals_of, it.stats_exact)
    return clock


def _totals_of(it: StatsParticipant) -> dict[str, Any]:
    return it.stats_totals()


def participants(it: StatsParticipant) -> list[StatsParticipant]:
    """The iterators whose totals ``it`` adds up, those that take part in ``stats()``."""
    return [p for p in it.stats_parents() if isinstance(p, StatsParticipant)]


def yields_batches(it: StatsParticipant) -> bool:
    """Whether the iterator hands out batches (see the module docstring)."""
    flag = it.stats_batches
    if flag is not None:
        return bool(flag)
    parents = participants(it)
    return bool(parents) and yields_batches(parents[0])


def stage_name(it: StatsParticipant) -> str | None:
    name = it.stats_name
    return type(it).__name__ if name == "" else name


def chain_totals(
    it: StatsParticipant, retired: dict[str, Any] | None = None, retired_s: float = 0.0
) -> dict[str, Any]:
    """The totals of a stage over its parents (see the module docstring).

    ``retired``: the totals of parents that are gone (an interleave's ended streams),
    and ``retired_s`` their seconds in ``next()``.
    """
    parents = participants(it)
    below = [p.stats_totals() for p in parents]
    if retired is not None:
        below.append(retired)
    totals = empty_totals()
    several = sum(1 for t in below if t["workers"]) > 1
    for i, sub in enumerate(below):
        add_totals(totals, sub, f"{i}/" if several else "")
    clock = clock_of(it)
    name = stage_name(it)
    inner = retired_s + sum(
        p.stats_clock.inside_s() for p in parents if p.stats_clock is not None and p.stats_clock.thread == clock.thread
    )
    own = clock.inside_s() - inner
    if name is not None and own > 0:
        stages = totals["stage_seconds"]
        stages[name] = stages.get(name, 0.0) + own
    outputs = clock.outputs
    if not below:
        totals["records_read"] += outputs
        totals["elements_out"] = outputs
    elif yields_batches(it):
        totals["batches_out"] = outputs
        if it.stats_batches:  # made its batches from its parents' outputs
            totals["elements_out"] = sum(t["elements_out"] for t in below)
    else:
        totals["elements_out"], totals["batches_out"] = outputs, 0
    totals["wait_s"] = clock.wait_s()
    return totals


def chain_pipeline(it: StatsParticipant) -> dict[str, Any]:
    """The first engine's description (what its iterator's ``stats_pipeline()`` says),
    with the iterator-level stages above it, lowest first."""
    parents = participants(it)
    pipeline = dict(parents[0].stats_pipeline()) if parents else {}
    name = stage_name(it)
    if name is not None:
        pipeline["stages"] = [*pipeline.get("stages", []), name]
    return pipeline


def stats_of(it: StatsParticipant, queues: dict[str, Any] | None = None) -> dict[str, Any]:
    """The public ``stats()`` dict of ``it`` (see :func:`~dataloader.engine.stats.shape.publish`)."""
    clock = clock_of(it)
    now = time.monotonic()
    return publish(
        it.stats_totals(),
        elapsed_s=now - clock.made,
        active_s=clock.active_s(now),
        first_next_s=clock.first_s,
        window=clock.history.window(now),
        pipeline=it.stats_pipeline(),
        queues=queues,
    )


def engines(it: Any) -> list[Any]:
    """The loader iterators (with ``unit_stats``) under ``it``, ``it`` included, in order."""
    found: list[Any] = []
    stack = [it]
    while stack:
        node = stack.pop()
        if hasattr(node, "unit_stats"):
            found.append(node)
        elif isinstance(node, StatsParticipant):
            stack.extend(reversed(list(node.stats_parents())))
    return found


def engine_totals(it: StatsParticipant, stats: Any, batches: bool) -> dict[str, Any]:
    """The totals of an engine's iterator: its :class:`~dataloader.engine.stats.units.Stats`
    (``stats``), with what the iterator handed out (batches or elements) and waited."""
    totals = stats.totals(time.monotonic())
    clock = clock_of(it)
    if batches:
        totals["elements_out"], totals["batches_out"] = stats.elements, clock.outputs
    else:
        totals["elements_out"] = clock.outputs
    totals["wait_s"] = clock.wait_s()
    return totals


def engine_pipeline(pipeline: Any, stats: Any, executor: Any = None) -> dict[str, Any]:
    """An engine's ``stats()["pipeline"]``: its description, what its executor says of its
    workers (their kind, and why), and when results come through shared memory, how much
    room the result blocks have left (what the advice reads)."""
    out = dict(pipeline)
    if executor is not None:
        out["workers"] = executor.describe()
    if stats.pipe_units:
        from dataloader.engine.pool.shm import block_room

        room = block_room()
        if room is not None:
            out["shm_free_mb"] = room / 2**20
    return out
