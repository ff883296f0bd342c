"""Mixture weights that change along the stream: :class:`WeightSchedule`.

A schedule is a list of points ``(at, weights)``: ``at`` counts elements the mixture has
drawn (or training steps of ``elements_per_step`` elements each, or tokens for
``weight_by="tokens"``), ``weights`` one non-negative weight per component (a dict by
name for a mixture of named datasets). Between two points the weights hold
(``interpolation="step"``) or move linearly (``"linear"``; two points at the same
``at`` make a jump there); after the last point they hold.

What ``at`` counts (it must be something a restore knows exactly):

* ``MapDataset.mix`` and ``IterDataset.mix`` of engine-backed streams: the position in
  the mixture's **global** stream, i.e. elements drawn by all hosts together, in global
  order (host ``h`` of ``H`` reads global positions ``h, h + H, ...``). Training step
  ``s`` with a global batch of ``B`` elements is positions ``[s * B, (s + 1) * B)``, so
  ``elements_per_step=B`` puts ``at`` in training steps, whatever the host count.
* the iterator-level ``IterDataset.mix`` (a dict of named datasets, packed or batched
  streams): the elements this mixture has produced on this host.

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

Example:
    >>> s = WeightSchedule([(0, [1, 0]), (4, [1, 1])])
    >>> s.bind(2).locate(list(range(8)))[0].tolist()
    [0, 0, 0, 0, 0, 1, 0, 1]
"""

from __future__ import annotations

import bisect
import json
import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from dataloader.dataset.compile.mixing import LOOKUP_PERIOD, MixSchedule

INTERPOLATIONS = ("step", "linear")


class WeightSchedule:
    """Mixture weights as a function of the number of elements drawn (see the module).

    Args:
        points: ``[(at, weights), ...]`` or ``{at: weights}``; the first at ``0``,
            ``at`` increasing (``"linear"``: two equal ``at`` in a row make a jump).
            ``weights``: one finite weight >= 0 per component (a list, or a dict by
            name), not all 0; normalised at each point.
        interpolation: ``"step"`` (hold until the next point) or ``"linear"``.
        elements_per_step: elements one unit of ``at`` stands for (a global batch:
            ``at`` in training steps); 1 by default.
        ramp_pieces: pieces of constant weights a linear ramp is cut into (each the
            weights at its middle); at most one piece an element.

    Raises:
        TypeError, ValueError: at construction, naming the point and the value.

    Example:
        >>> import dataloader as dl
        >>> schedule = dl.WeightSchedule({0: [0.9, 0.1], 1000: [0.5, 0.5]}, elements_per_step=32)
        >>> schedule.weights_at(0), schedule.weights_at(32_000)
        ([0.9, 0.1], [0.5, 0.5])
    """

    def __init__(
        self,
        points: Sequence[tuple[int, Any]] | Mapping[int, Any],
        *,
        interpolation: str = "step",
        elements_per_step: int = 1,
        ramp_pieces: int = 100,
    ) -> None:
        if interpolation not in INTERPOLATIONS:
            raise ValueError(f"interpolation must be one of {list(INTERPOLATIONS)}, got {interpolation!r}")
        for name, value in (("elements_per_step", elements_per_step), ("ramp_pieces", ramp_pieces)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise ValueError(f"WeightSchedule {name} must be an integer >= 1, got {value!r}")
        self.interpolation = interpolation
        self.elements_per_step = int(elements_per_step)
        self.ramp_pieces = int(ramp_pieces)
        items = list(points.items()) if isinstance(points, Mapping) else list(points)
        if not items:
            raise ValueError("WeightSchedule needs at least one point (0, weights)")
        self.keys: list[str] | None = None
        self.points: list[tuple[int, list[float]]] = []
        for i, point in enumerate(items):
            self.points.append(self._point(i, point, items))
        self._pieces()

    # -- checks ------------------------------------------------------------------------

    def _point(self, i: int, point: Any, items: list[Any]) -> tuple[int, list[float]]:
        try:
            at, weights = point
        except (TypeError, ValueError):
            raise TypeError(f"WeightSchedule point {i} is {point!r}; write each as (at, weights)") from None
        if isinstance(at, bool) or not isinstance(at, numbers.Integral) or at < 0:
            raise ValueError(f"WeightSchedule point {i}: at must be an integer >= 0, got {at!r}")
        if i == 0 and at != 0:
            raise ValueError(f"WeightSchedule's first point must be at 0 (the weights from the start), got at={at}; "
                             f"add (0, weights) first")
        if i:
            before = items[i - 1][0]
            jump = self.interpolation == "linear" and at == before and (i < 2 or items[i - 2][0] != at)
            if at < before or (at == before and not jump):
                what = "increasing" if self.interpolation == "step" else "increasing (two equal in a row make a jump)"
                raise ValueError(f"WeightSchedule points must be sorted by at, {what}: point {i} is at {at} "
                                 f"after point {i - 1} at {before}")
        if isinstance(weights, Mapping):
            names = sorted(weights)
            if self.keys is None and i == 0:
                if not all(isinstance(k, str) for k in names):
                    raise TypeError(f"WeightSchedule point 0: weights by name need str keys, got {names!r}")
                self.keys = names
            if self.keys != names:
                raise ValueError(f"WeightSchedule point {i} has weights for {names}, point 0 for "
                                 f"{self.keys if self.keys is not None else 'a list'}; give every point the same")
            weights = [weights[k] for k in names]
        elif self.keys is not None or isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence):
            raise TypeError(f"WeightSchedule point {i}: weights must be a list (or a dict by name, as at "
                            f"every point), got {weights!r}")
        values = list(weights)
        count = len(self.points[0][1]) if i else len(values)
        if len(values) != count or not count:
            raise ValueError(f"WeightSchedule point {i} has {len(values)} weights, point 0 has {count}; "
                             f"give one weight per component at every point")
        for j, w in enumerate(values):
            if isinstance(w, bool) or not isinstance(w, numbers.Real) or not math.isfinite(w) or w < 0:
                raise ValueError(f"WeightSchedule point {i}: weight {j} is {w!r}; weights must be finite "
                                 f"numbers >= 0 (0 leaves a component out until a later point)")
        total = math.fsum(values)
        if total <= 0:
            raise ValueError(f"WeightSchedule point {i} (at {at}) has only zero weights; give one "
                             f"component a weight > 0")
        return int(at), [float(w) / total for w in values]

    # -- pieces ------------------------------------------------------------------------

    def _pieces(self) -> None:
        """``self.starts`` (elements) and ``self.weights`` (normalised), one per piece."""
        e = self.elements_per_step
        pieces: list[tuple[int, list[float]]] = []
        points = self.points
        for i, (at, w) in enumerate(points):
            nxt = points[i + 1] if i + 1 < len(points) else None
            if self.interpolation == "step" or nxt is None or nxt[1] == w:
                pieces.append((at * e, w))
                continue
            start, stop = at * e, nxt[0] * e
            n = min(self.ramp_pieces, stop - start)
            for j in range(n):
                f = (j + 0.5) / n
                pieces.append((start + (stop - start) * j // n, [a + (b - a) * f for a, b in zip(w, nxt[1])]))
        merged: list[tuple[int, list[float]]] = []
        for start, w in pieces:
            if merged and merged[-1][0] == start:
                merged[-1] = (start, w)  # a jump: the later weights hold from here
            elif not merged or merged[-1][1] != w:
                merged.append((start, w))
        self.starts = [s for s, _ in merged]
        self.weights = [w for _, w in merged]

    def __len__(self) -> int:
        return len(self.points[0][1])

    def weights_at(self, count: int) -> list[float]:
        """The normalised weights after ``count`` elements (the piece holding ``count``)."""
        return list(self.weights[bisect.bisect_right(self.starts, int(count)) - 1])

    def bind(self, count: int, keys: Sequence[str] | None = None, what: str = "mix") -> ScheduledMix:
        """The schedule laid out for ``count`` components (named ``keys`` for a dict).

        Raises:
            ValueError: the schedule's weights do not match the components.
        """
        if keys is not None and self.keys is not None and list(keys) != self.keys:
            raise ValueError(f"{what}: the WeightSchedule has weights for {self.keys}, the datasets are "
                             f"{sorted(keys)}; give the schedule's points weights by the same names")
        if keys is not None and self.keys is None:
            raise ValueError(f"{what}: the datasets are named ({sorted(keys)}) but the WeightSchedule's "
                             f"weights are lists; give each point its weights as a dict by name")
        if keys is None and self.keys is not None:
            raise ValueError(f"{what}: the WeightSchedule has weights by name ({self.keys}) but the datasets "
                             f"are a list; mix a dict of datasets, or give the points lists of weights")
        if len(self) != count:
            raise ValueError(f"{what}: the WeightSchedule has {len(self)} weights a point for {count} "
                             f"datasets; give one weight per dataset at every point")
        return ScheduledMix(self)

    def describe(self) -> list[Any]:
        """What a state records of the schedule (points, interpolation, units)."""
        points = [[at, [round(w, 12) for w in ws]] for at, ws in self.points]
        return ["schedule", self.interpolation, self.elements_per_step, self.ramp_pieces, points]

    def __repr__(self) -> str:
        return f"WeightSchedule({json.dumps(self.describe()[4])}, interpolation={self.interpolation!r}, " \
               f"elements_per_step={self.elements_per_step})"


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


def bind_weights(weights: Any, count: int, keys: Sequence[str] | None, what: str) -> MixSchedule | ScheduledMix:
    """Fixed weights' :class:`MixSchedule`, or a :class:`WeightSchedule` bound to the
    ``count`` components (named ``keys`` for a dict of datasets)."""
    if isinstance(weights, WeightSchedule):
        return weights.bind(count, keys, what=what)
    return MixSchedule(weights, count)


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
