"""Turns the ordered stream of unit results into the user's stream, tracking the position.

One assembler per unit layout (see :mod:`dataloader.engine.plan`). Each has ``next()`` and
``state() -> Cursor``, the restart point after the last output handed out. The common ``batch`` layout does no per-record work here.
"""

from __future__ import annotations

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

    def next(self) -> Any:
        while self._i >= len(self._outputs):
            r = next(self._units)
            self._outputs, self._start, self._stop = r.outputs, r.start, r.stop
            self._i, self._skip = self._skip, 0
        out = self._outputs[self._i]
        self._outputs[self._i] = None  # let the batch's memory go once the user drops it
        self._i += 1
        return out

    def state(self) -> Cursor:
        if self._i < len(self._outputs):
            return Cursor(self._start, 0, self._i)
        return Cursor(self._stop, 0, self._skip)


class ElementAssembler:
    """``elements`` layout, and the survivor stream under ``regroup``."""

    def __init__(self, units: Iterator[UnitResult], cursor: Cursor) -> None:
        self._units = units
        self._outputs: list[Any] = []
        self._pos = self._sub = np.zeros(0, dtype=np.int64)
        self._i = 0
        self._stop = cursor.position
        # Restoring mid-position: the outputs of that position already handed out.
        self._first: Cursor | None = Cursor(cursor.position, cursor.sub_index)

    def _pull(self) -> None:
        r = next(self._units)
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
        self._i += 1
        return out

    def take(self, n: int) -> tuple[list[Any], tuple[int, int] | None]:
        """Up to ``n`` elements (fewer only at the end) and the first one's tags."""
        got: list[Any] = []
        first = None
        while len(got) < n:
            if self._i >= len(self._outputs):
                try:
                    self._pull()
                except StopIteration:
                    break
                continue
            if first is None:
                first = (int(self._pos[self._i]), int(self._sub[self._i]))
            j = min(len(self._outputs), self._i + n - len(got))
            got.extend(self._outputs[self._i : j])
            self._outputs[self._i : j] = [None] * (j - self._i)
            self._i = j
        return got, first

    def state(self) -> Cursor:
        if self._i < len(self._outputs):
            return Cursor(int(self._pos[self._i]), int(self._sub[self._i]))
        if self._first is not None:
            return self._first
        return Cursor(self._stop)


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
        self._src = ElementAssembler(units, cursor)
        self._outputs: list[Any] = []
        self._j = 0
        self._batch_start = cursor._replace(skip=0)
        self._skip = cursor.skip
        self._end: Cursor | None = None

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
        return ElementAssembler(units, cursor)
    return RegroupAssembler(plan, units, cursor, timings)
