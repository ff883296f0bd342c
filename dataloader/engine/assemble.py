"""Turns the ordered stream of unit results into the user's stream, tracking the position.

One assembler per unit layout (see :mod:`dataloader.engine.plan`). Each has ``next()`` and
``state() -> Cursor``, the restart point after the last output handed out, and
``last_step()``, the units and outputs that output came from (what
:func:`~dataloader.engine.fingerprint.of_step` reads; None before the first output), and
``last_tag()``, the engine tag of that output when it is one element. The common
``batch`` layout does no per-record work here.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np

from dataloader.engine.compute import UnitResult, batch_and_post
from dataloader.engine.plan import BATCH, ELEMENTS, Plan
from dataloader.engine.state import Cursor


class BatchAssembler:
    """``batch`` layout: each unit's outputs (usually one batch) are handed on as they are."""

    def __init__(self, units: Iterator[UnitResult], cursor: Cursor) -> None:
        self._units = units
        self._outputs: list[Any] = []
        self._i = 0
        self._start = self._stop = cursor.position
        self._skip = cursor.skip
        self._unit: UnitResult | None = None
        self._last: tuple[UnitResult, int] | None = None  # the last output handed out

    def next(self) -> Any:
        while self._i >= len(self._outputs):
            r = self._unit = next(self._units)
            self._outputs, self._start, self._stop = r.outputs, r.start, r.stop
            self._i, self._skip = self._skip, 0
        out = self._outputs[self._i]
        self._last = (self._unit, self._i)  # type: ignore[assignment]
        self._outputs[self._i] = None  # let the batch's memory go once the user drops it
        self._i += 1
        return out

    def last_tag(self) -> tuple[int, int] | None:
        """None: a batch holds several elements (see :meth:`ElementAssembler.last_tag`)."""
        return None

    def state(self) -> Cursor:
        if self._i < len(self._outputs):
            return Cursor(self._start, 0, self._i)
        return Cursor(self._stop, 0, self._skip)

    def last_step(self) -> tuple[list[UnitResult], list[tuple[UnitResult, int, int]], int | None] | None:
        if self._last is None:
            return None
        r, i = self._last
        return [r], [(r, i, i + 1)], i


class ElementAssembler:
    """``elements`` layout, and the survivor stream under ``regroup``.

    The state is defined on the plan's grid of ``unit_size`` positions, so it does not
    depend on how the stream was cut into units (:mod:`~dataloader.engine.sizing`):
    after an output at position ``p`` it is the next output's tags if that output comes
    before the grid line after ``p``, else that line. When the units in hand end
    before the line and a filter or flat map may leave positions without outputs,
    ``state()`` looks at the next units (what ``next()`` would compute anyway); an
    error met there is raised by the ``next()`` that reaches it.

    Args:
        grid: the plan's ``unit_size``; ``end``: the stream's end (None: infinite);
        gaps: a filter or flat map may leave a position without outputs.
    """

    def __init__(
        self, units: Iterator[UnitResult], cursor: Cursor, grid: int = 1, end: int | None = None, gaps: bool = True
    ) -> None:
        self._units = units
        self._outputs: list[Any] = []
        self._pos = self._sub = np.zeros(0, dtype=np.int64)
        self._i = 0
        self._stop = cursor.position
        # Restoring mid-position: the outputs of that position already handed out.
        self._first: Cursor | None = Cursor(cursor.position, cursor.sub_index)
        self._grid, self._end, self._gaps = grid, end, gaps
        self._ahead: deque[UnitResult] = deque()  # units state() pulled to look ahead
        self._error: Exception | None = None  # what the look-ahead met, for next()
        self._ended = False  # next() met the end of the stream
        self._unit: UnitResult | None = None
        self._last: tuple[UnitResult, int] | None = None  # the last output handed out
        # take(): the units its elements spanned and its (unit, i, j) slices.
        self.taken: tuple[list[UnitResult], list[tuple[UnitResult, int, int]]] | None = None

    def _next_unit(self) -> UnitResult:
        if self._ahead:
            return self._ahead.popleft()
        try:
            if self._error is not None:
                error, self._error = self._error, None
                raise error
            return next(self._units)
        except StopIteration:
            self._ended = True
            raise

    def _pull(self) -> None:
        r = self._unit = self._next_unit()
        self._outputs = r.outputs
        self._pos, self._sub = r.tags()
        self._stop, self._i = r.stop, 0
        if self._first is not None:
            # Restoring mid-position: drop the outputs of that position already handed out.
            p, s, _ = self._first
            self._first = None
            while self._i < len(self._outputs) and self._pos[self._i] == p and self._sub[self._i] < s:
                self._i += 1

    def next(self) -> Any:
        while self._i >= len(self._outputs):
            self._pull()
        out = self._outputs[self._i]
        self._outputs[self._i] = None
        self._last = (self._unit, self._i)  # type: ignore[assignment]
        self._i += 1
        return out

    def last_step(self) -> tuple[list[UnitResult], list[tuple[UnitResult, int, int]], int | None] | None:
        if self._last is None:
            return None
        r, i = self._last
        return [r], [(r, i, i + 1)], None

    def last_tag(self) -> tuple[int, int] | None:
        """The ``(position, sub)`` of the element handed out last (None: none yet): what
        a packer over the engine's stream names its rows' records by."""
        i = self._i
        if not 0 < i <= len(self._pos):
            return None
        return int(self._pos[i - 1]), int(self._sub[i - 1])

    def take(self, n: int) -> tuple[list[Any], tuple[int, int] | None]:
        """Up to ``n`` elements (fewer only at the end) and the first one's tags."""
        got: list[Any] = []
        first = None
        units = [self._unit] if self._unit is not None else []
        slices: list[tuple[UnitResult, int, int]] = []
        while len(got) < n:
            if self._i >= len(self._outputs):
                try:
                    self._pull()
                except StopIteration:
                    break
                units.append(self._unit)  # type: ignore[arg-type]
                continue
            if first is None:
                first = (int(self._pos[self._i]), int(self._sub[self._i]))
            j = min(len(self._outputs), self._i + n - len(got))
            slices.append((self._unit, self._i, j))  # type: ignore[arg-type]
            got.extend(self._outputs[self._i : j])
            self._outputs[self._i : j] = [None] * (j - self._i)
            self._i = j
        self.taken = (units, slices)
        return got, first

    def state(self) -> Cursor:
        if self._first is not None:
            return self._first
        if self._ended or self._i == 0:
            # Every unit was pulled (the stream ended): as after a fixed-size unit.
            return Cursor(self._stop)
        # The grid line after the last output handed out: a fixed-size unit ends there.
        line = (int(self._pos[self._i - 1]) // self._grid + 1) * self._grid
        if self._end is not None:
            line = min(line, self._end)
        if self._i < len(self._outputs):
            nxt = Cursor(int(self._pos[self._i]), int(self._sub[self._i]))
            return nxt if nxt.position < line else Cursor(line)
        if self._stop >= line or not self._gaps:
            # Without gaps the next output is at self._stop, which is <= line.
            return Cursor(min(self._stop, line))
        return self._look_ahead(line)

    def _look_ahead(self, line: int) -> Cursor:
        """The state when the units in hand end before ``line``: the first output of
        the next units, or ``line`` if there is none before it."""
        stop = self._stop
        i = 0
        while True:
            if i == len(self._ahead):
                if self._error is not None:
                    return Cursor(stop)
                try:
                    self._ahead.append(next(self._units))
                except Exception as exc:  # raised by the next() that reaches it
                    self._error = exc
                    return Cursor(stop)
            r = self._ahead[i]
            i += 1
            if r.outputs:
                pos, sub = r.tags()
                return Cursor(int(pos[0]), int(sub[0])) if pos[0] < line else Cursor(line)
            stop = r.stop
            if stop >= line:
                return Cursor(line)


class RegroupAssembler:
    """``regroup`` layout: batches survivors in the parent, then the post-batch operations."""

    def __init__(
        self,
        plan: Plan,
        units: Iterator[UnitResult],
        cursor: Cursor,
        timings: dict[str, float],
    ) -> None:
        assert plan.batch is not None
        self._plan = plan
        self._timings = timings
        self._src = ElementAssembler(units, cursor, plan.unit_size, plan.num_positions, gaps=True)
        self._outputs: list[Any] = []
        self._j = 0
        self._batch_start = cursor._replace(skip=0)
        self._skip = cursor.skip
        self._end: Cursor | None = None
        self._taken: tuple[list[UnitResult], list[tuple[UnitResult, int, int]]] | None = None

    def next(self) -> Any:
        batch = self._plan.batch
        assert batch is not None
        while self._j >= len(self._outputs):
            if self._end is not None:
                raise StopIteration
            start = self._src.state()
            elements, first = self._src.take(batch.batch_size)
            if not batch.keeps(len(elements)):
                # Dropping a remainder hands nothing out, so the state stays where it was.
                self._end = start
                raise StopIteration
            assert first is not None
            self._outputs, _, _ = batch_and_post(self._plan, elements, *first, self._timings)
            self._batch_start = start
            self._taken = self._src.taken
            self._j, self._skip = self._skip, 0
        out = self._outputs[self._j]
        self._outputs[self._j] = None
        self._j += 1
        return out

    def state(self) -> Cursor:
        if self._end is not None:
            return self._end
        if self._j < len(self._outputs):
            return self._batch_start._replace(skip=self._j)
        if self._skip:
            return self._batch_start._replace(skip=self._skip)
        return self._src.state()

    def last_step(self) -> tuple[list[UnitResult], list[tuple[UnitResult, int, int]], int | None] | None:
        """The units and element slices of the last batch: its post-batch outputs (run
        here) share it."""
        return None if self._taken is None else (*self._taken, None)

    def last_tag(self) -> tuple[int, int] | None:
        """None: a batch holds several elements."""
        return None


def from_position(r: UnitResult, position: int) -> UnitResult:
    """The part of an ``elements`` or ``regroup`` unit result from local ``position`` on:
    the result of the unit ``[position, r.stop)`` (an element's outputs depend on its
    record and position only, and the states not on the cut), without computing it."""
    pos, sub = r.tags()
    keep = pos >= position
    return dataclasses.replace(
        r, start=position, outputs=[x for x, k in zip(r.outputs, keep.tolist()) if k],
        positions=pos[keep], subs=sub[keep], elements=-1,
        sources=None if r.sources is None else r.sources[position - r.start :],
        digests=None if r.digests is None else np.asarray(r.digests)[keep],
    )


def make_assembler(
    plan: Plan,
    units: Iterator[UnitResult],
    cursor: Cursor,
    timings: dict[str, float],
) -> BatchAssembler | ElementAssembler | RegroupAssembler:
    """The assembler for the plan's layout, starting at ``cursor``; ``timings`` collects
    parent-side work."""
    if plan.layout == BATCH:
        return BatchAssembler(units, cursor)
    if plan.layout == ELEMENTS:
        gaps = any(s.op.reshapes for s in plan.pre)
        return ElementAssembler(units, cursor, plan.unit_size, plan.num_positions, gaps)
    return RegroupAssembler(plan, units, cursor, timings)
