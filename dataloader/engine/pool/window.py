"""The pool's in-order scheduling window: which unit goes where, and what comes out next.

Pure bookkeeping, no processes (so it is tested without starting any). Units are
numbered 0, 1, 2, ... in stream order, each a range of positions from the plan. The
window

* hands out the next unit to compute, units lost with a dead worker first, never more
  than ``size`` units past the consumer's head (which bounds memory);
* picks the least loaded ready worker that holds fewer than ``per_worker`` units, so
  one slow unit does not stall the others (dynamic load balancing);
* remembers which units each worker holds, in the order they were sent (a worker
  answers in that order);
* keeps finished units until the consumer reaches them, and hands them out in order;
* counts, per unit, how often it was the first unit of a worker that died: a worker
  computes its units in order, so that unit is the one that killed it;
* reports each finished unit to the unit ranges (when they have ``observe``, as the
  plan's :class:`~dataloader.engine.sizing.Units` do), which size the units made next.

A unit's range is taken from the plan once, when the unit is made, and kept until the
consumer has it: a unit sent again (its worker died) covers the very same positions,
however the sizes of the units made since have changed.

``generation`` numbers the stream: :meth:`reset` starts a new one, and the answers
still to come about the old one are recognised and dropped.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple


class InFlight(NamedTuple):
    """A unit sent to a worker; ``token`` is what was lent for its result (a block)."""

    generation: int
    unit: int
    token: Any


class Outcome(NamedTuple):
    """A finished unit: its result, or the exception to raise at its place."""

    value: Any
    error: BaseException | None = None


class Window:
    """Scheduling state of one pool (see the module docstring).

    Args:
        size: units allowed past the consumer's head (``worker_count * buffer``).
        per_worker: units one worker may hold at once.
    """

    def __init__(self, size: int, per_worker: int) -> None:
        self.size = size
        self.per_worker = per_worker
        self.generation = 0
        self._held: dict[int, deque[InFlight]] = {}
        self.reset(iter(()))

    def reset(self, units: Iterator[tuple[int, int]]) -> None:
        """Starts a new stream of unit ranges; what workers still hold becomes stale."""
        self.generation += 1
        self._units = units
        self._observe = getattr(units, "observe", None)
        self._ranges: dict[int, tuple[int, int]] = {}
        self.created = 0  # units taken from the plan so far
        self._exhausted = False
        self._redo: list[int] = []
        self._done: dict[int, Outcome] = {}
        self.head = 0  # the next unit the consumer gets
        self._crashes: dict[int, int] = {}

    # -- workers ---------------------------------------------------------------------

    def add_worker(self, worker: int) -> None:
        self._held[worker] = deque()

    def remove_worker(self, worker: int) -> list[InFlight]:
        """Forgets a worker; returns what it held, oldest first."""
        return list(self._held.pop(worker))

    def clear_workers(self) -> None:
        """Forgets every worker (the pool was stopped; a new one starts)."""
        self._held.clear()

    def held(self, worker: int) -> int:
        return len(self._held[worker])

    def current(self, worker: int) -> InFlight | None:
        """The unit ``worker`` computes now (or starts next): its oldest, or None."""
        held = self._held.get(worker)
        return held[0] if held else None

    def pick_worker(self, ready: Iterable[int]) -> int | None:
        """The least loaded of ``ready`` workers with room for a unit, if any."""
        best, load = None, self.per_worker
        for worker in ready:
            n = len(self._held[worker])
            if n < load:
                best, load = worker, n
        return best

    # -- units -----------------------------------------------------------------------

    def range(self, unit: int) -> tuple[int, int]:
        return self._ranges[unit]

    def next_unit(self) -> int | None:
        """The next unit to compute, or None (nothing left, or the window is full)."""
        if self._redo:
            return heapq.heappop(self._redo)
        if self._exhausted or self.created >= self.head + self.size:
            return None
        rng = next(self._units, None)
        if rng is None:
            self._exhausted = True
            return None
        unit = self.created
        self.created += 1
        self._ranges[unit] = rng
        return unit

    def give_back(self, unit: int) -> None:
        """A unit that could not be sent; it goes out again first."""
        heapq.heappush(self._redo, unit)

    def sent(self, worker: int, unit: int, token: Any) -> None:
        self._held[worker].append(InFlight(self.generation, unit, token))

    def answered(self, worker: int, generation: int, unit: int) -> InFlight:
        """The worker answered about ``(generation, unit)``: its oldest unit.

        The caller gives the entry's token back and keeps the answer only if
        ``entry.generation == window.generation``.
        """
        entry = self._held[worker].popleft()
        if (entry.generation, entry.unit) != (generation, unit):
            raise AssertionError(
                f"worker {worker} answered unit {unit} of stream {generation}, but its "
                f"oldest task was unit {entry.unit} of stream {entry.generation}"
            )
        return entry

    def finish(self, unit: int, outcome: Outcome) -> None:
        self._done[unit] = outcome
        if self._observe is not None and outcome.error is None:
            self._observe(outcome.value)

    def take_head(self) -> Outcome | None:
        """The consumer's next outcome if it is finished (and moves the head on)."""
        outcome = self._done.pop(self.head, None)
        if outcome is not None:
            self._ranges.pop(self.head, None)
            self.head += 1
        return outcome

    def has_finished(self, unit: int) -> bool:
        """Whether ``unit`` is finished and waiting for the consumer."""
        return unit in self._done

    @property
    def buffered(self) -> int:
        """Finished units waiting for the consumer."""
        return len(self._done)

    @property
    def exhausted(self) -> bool:
        """The plan has no unit left to hand out (the end of the stream is in sight)."""
        return self._exhausted and not self._redo

    @property
    def finished(self) -> bool:
        """Every unit of the stream was handed to the consumer."""
        return self._exhausted and self.head >= self.created and not self._redo

    def worker_timed_out(self, worker: int) -> tuple[list[Any], int | None]:
        """A worker was killed for taking too long over its current unit.

        Its other units go out again. Returns the tokens of everything it held and the
        unit it was stuck on (None if that unit belongs to an earlier stream); the
        caller finishes that unit with an error: it is not computed again.
        """
        tokens, stuck = [], None
        for i, entry in enumerate(self.remove_worker(worker)):
            tokens.append(entry.token)
            if entry.generation != self.generation:
                continue
            if i == 0:
                stuck = entry.unit
            else:
                heapq.heappush(self._redo, entry.unit)
        return tokens, stuck

    def worker_died(self, worker: int, max_crashes: int) -> tuple[list[Any], list[int]]:
        """A worker died: its current units go out again.

        Returns the tokens of everything it held (to give back) and the units that have
        now been the first unit of a dead worker ``max_crashes`` times (poison units,
        not sent again; the caller finishes them with an error).
        """
        tokens, poisoned = [], []
        first = True
        for entry in self.remove_worker(worker):
            tokens.append(entry.token)
            if entry.generation != self.generation:
                continue
            if first:
                first = False
                self._crashes[entry.unit] = self._crashes.get(entry.unit, 0) + 1
                if self._crashes[entry.unit] >= max_crashes:
                    poisoned.append(entry.unit)
                    continue
            heapq.heappush(self._redo, entry.unit)
        return tokens, poisoned
