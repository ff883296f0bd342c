"""A :class:`~dataloader.dataset.compile.schedule.WeightSchedule` bound to its
components: which component, and which of its draws, sits at each position.

The schedule is compiled into **pieces** of constant weights (a ramp into
``ramp_pieces`` pieces, each with the weights at its middle). Inside a piece the
components are laid out by :class:`~dataloader.dataset.MixSchedule` (Grain's nested
order), counted from the piece's start; each component's draws before a piece are
summed once when the schedule is bound. So the component and the draw number at
position ``p`` are a pure function of ``p``, the weights and the schedule, found in
``O(log pieces + components)``: the state stays one position, a restore at any step
(a switch included) continues exactly, an elastic restore onto another host count
reads the same global stream, and a component's draws are numbered ``0, 1, 2, ...``
without gaps or repeats, so each record is used at most once per epoch of its source.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from dataloader.dataset.compile.mixing import LOOKUP_PERIOD, MixSchedule

if TYPE_CHECKING:
    from dataloader.dataset.compile.schedule import WeightSchedule


class Piece(NamedTuple):
    """One piece of a bound schedule, for readers that walk it position by position."""

    start: int
    stop: int | None
    mix: MixSchedule
    table: list[int] | None  # the component (among ``active``) of each position of a
    # period, or of the piece when it is shorter than one
    active: list[int]  # the components of weight > 0
    integral: list[float]  # each component's share summed up to ``start``
    weights: list[float]  # normalised

    def component(self, position: int) -> int:
        r = position - self.start
        local = self.table[r % len(self.table)] if self.table is not None else self.mix.locate_one(r)[0]
        return self.active[local]


class ScheduledMix:
    """A :class:`WeightSchedule` bound to its components: where each position draws.

    The same interface as :class:`MixSchedule` where the mixtures read one
    (``locate``, ``locate_one``, ``position_of``, ``describe``), plus the components'
    cumulative shares for token weighting (:meth:`cumulative`).
    """

    def __init__(self, schedule: WeightSchedule) -> None:
        self.schedule = schedule
        self.count = len(schedule)
        self.starts = np.asarray(schedule.starts, dtype=np.int64)
        self._weights = np.asarray(schedule.weights, dtype=np.float64)
        self._active: list[np.ndarray] = []
        self._mixes: list[MixSchedule] = []
        for w in schedule.weights:
            active = np.flatnonzero(np.asarray(w) > 0)
            self._active.append(active)
            self._mixes.append(MixSchedule([w[c] for c in active.tolist()]))
        # offsets[i, c]: draws of component c before piece i
        offsets = np.zeros((len(self.starts), self.count), dtype=np.int64)
        for i in range(1, len(self.starts)):
            drawn = _draws_before(self._mixes[i - 1].counts, int(self.starts[i] - self.starts[i - 1]))
            offsets[i] = offsets[i - 1]
            offsets[i, self._active[i - 1]] += drawn
        self._offsets = offsets
        # A piece shorter than its period (a ramp's) is laid out over its own length, not
        # over a period: 2,897 positions laid out to read 164 cost 27 µs a record, and
        # locating without a table 7 µs (8 components, measured on the loaded VM).
        ends = [*self.schedule.starts[1:], None]
        self._short = [stop is not None and stop - start < mix.period and stop - start <= LOOKUP_PERIOD
                       for start, stop, mix in zip(self.schedule.starts, ends, self._mixes)]
        self._tables: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        # the integral of each component's share up to piece i (token weighting)
        lengths = np.diff(self.starts).astype(np.float64)
        self._integral = np.vstack([np.zeros((1, self.count)), np.cumsum(self._weights[:-1] * lengths[:, None], axis=0)])

    def _piece(self, position: int) -> int:
        return bisect.bisect_right(self.schedule.starts, position) - 1

    def locate_one(self, position: int) -> tuple[int, int]:
        """``(component, index within it)`` of one position."""
        i = self._piece(int(position))
        c, k = self._mixes[i].locate_one(int(position) - int(self.starts[i]))
        comp = int(self._active[i][c])
        return comp, int(self._offsets[i, comp]) + k

    def locate(self, positions: Any) -> tuple[np.ndarray, np.ndarray]:
        """``(component, index within it)`` of each position (int64 arrays)."""
        pos = np.asarray(positions, dtype=np.int64)
        if pos.size:  # a batch mostly lies in one piece: no split
            first, last = self._piece(int(pos.min())), self._piece(int(pos.max()))
            if first == last:
                c, k = self._located(first, pos - self.starts[first])
                c = self._active[first][c]
                return c, k + self._offsets[first, c]
        piece = np.searchsorted(self.starts, pos, side="right") - 1
        comp, idx = np.empty_like(pos), np.empty_like(pos)
        for i in np.unique(piece).tolist():
            where = piece == i
            c, k = self._located(i, pos[where] - self.starts[i])
            c = self._active[i][c]
            comp[where], idx[where] = c, k + self._offsets[i, c]
        return comp, idx

    def _located(self, i: int, local: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``MixSchedule.locate`` of piece ``i``'s own positions: a piece shorter than its
        period (a ramp's) is laid out once over its own length, not over a period."""
        if not self._short[i]:
            return self._mixes[i].locate(local)
        table = self._tables.get(i)
        if table is None:
            length = int(self.starts[i + 1] - self.starts[i])
            table = self._tables[i] = self._mixes[i].locate(np.arange(length), lay_out=False)
        return table[0][local], table[1][local]

    def piece(self, position: int) -> Piece:
        """The piece holding ``position``: for a reader that walks positions in order and
        looks each up in the piece's table (period up to 4,096) until ``stop``."""
        i = self._piece(int(position))
        stop = int(self.starts[i + 1]) if i + 1 < len(self.starts) else None
        mix = self._mixes[i]
        if self._short[i]:  # the piece's own positions, laid out (r % length is r)
            assert stop is not None
            table: list[int] | None = self._located(i, np.arange(stop - int(self.starts[i])))[0].tolist()
        else:
            table = mix.table.tolist() if mix.period <= 4096 else None
        return Piece(int(self.starts[i]), stop, mix, table, self._active[i].tolist(),
                     self._integral[i].tolist(), self._weights[i].tolist())

    def position_of(self, component: int, k: int) -> int | None:
        """The position of ``component``'s draw ``k`` (None: the schedule never gets there)."""
        i = int(np.searchsorted(self._offsets[:, component], k, side="right")) - 1
        active = self._active[i].tolist()
        if component not in active:
            return None  # off in the last piece that starts below k draws: never drawn again
        local = self._mixes[i].position_of(active.index(component), int(k - self._offsets[i, component]))
        return int(self.starts[i]) + local

    def exhausted_length(self, lengths: Sequence[int | None]) -> int | None:
        """Positions before the first finite component runs out (None: never)."""
        ends = [self.position_of(c, n) for c, n in enumerate(lengths) if n is not None]
        found = [e for e in ends if e is not None]
        return min(found) if found else None

    def weights_at(self, count: int) -> np.ndarray:
        """The normalised weights after ``count`` elements (or tokens)."""
        return self._weights[self._piece(int(count))]

    def cumulative(self, count: int) -> np.ndarray:
        """Each component's share of the first ``count`` elements (or tokens), summed."""
        i = self._piece(int(count))
        return self._integral[i] + (int(count) - int(self.starts[i])) * self._weights[i]

    def describe(self) -> list[Any]:
        return self.schedule.describe()


def _draws_before(counts: list[int], n: int) -> list[int]:
    """Draws of each component among the first ``n`` positions of a ``MixSchedule`` of
    proportions ``counts`` (level ``c`` gives component ``c`` ``ceil(a * p_c / rest_c)``
    of its first ``a`` positions; see :mod:`.mixing`)."""
    period = sum(counts)
    q, a = divmod(n, period)
    out, rest = [], period
    for p in counts[:-1]:
        d = -(-a * p // rest)
        out.append(q * p + d)
        a, rest = a - d, rest - p
    out.append(q * counts[-1] + a)
    return out
