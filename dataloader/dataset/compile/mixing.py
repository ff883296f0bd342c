"""Weighted mixing of several streams, in Grain's order, as a pure function of position.

Grain turns the weights into integer proportions ``p_c`` (the smallest weight scaled to
100, each ``int(w * 100 / min(w))``; equal ``1``s when no weights are given) and lays
the components out one inside the other, over a period of ``S = sum(p_c)`` positions:

* component 0 is spread as evenly as integers allow: among the first ``i`` positions
  it has ``ceil(i * p_0 / S)`` draws, so position ``i`` is its draw number
  ``ceil(i * p_0 / S)`` exactly when that count steps up at ``i + 1``;
* the other positions, renumbered ``0, 1, ...`` (``floor(i * (S - p_0) / S)`` of them
  before ``i``), are mixed the same way among components ``1, 2, ...`` with total
  ``S - p_0``; and so on, the last component taking what is left.

Every level is periodic in its own total, so position ``i = q * S + r`` is draw
``q * p_c + k_r`` of the component ``c`` that position ``r`` of the first period
holds: O(number of components) integer steps per position, vectorised in
:meth:`MixSchedule.locate`, no table, any period. The state of a mixture is therefore
still a single position. This reproduces Grain's ``MapDataset.mix`` and
``IterDataset.mix`` element for element (the tests pin sequences computed with Grain
0.2.18), including the quirk that float weights are read through that scaling:
0.3/0.7 mixes as 100/233, not 3/7.

Spec strings as MaxText writes them, ``"a*.array_record:0.3;b*.array_record:0.7"``, are
parsed by :func:`parse_mixture_spec` (the weight follows the last ``:``, so paths such
as ``gs://...`` keep theirs).

Example:
    >>> s = MixSchedule([1, 2])
    >>> s.counts, s.table.tolist()
    ([100, 200], [0, 1, 1, 0, 1, 1, 0, 1, 1, 0])
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

# Periods up to this are laid out once when ``table`` is asked for; longer ones are
# only ever located position by position.
MAX_TABLE = 2**20
# Periods up to this are located through the laid-out table.
LOOKUP_PERIOD = 2**16
# Above this total, products ``r * S`` could overflow int64: locate with Python ints.
_INT64_SAFE = 2**31
# From this many components on, positions are located by walking runs of consecutive
# positions down the levels in Python (:meth:`MixSchedule._walk`) rather than by one numpy
# pass a level over every position: per level a run costs two integer divisions, where
# numpy costs a dozen calls. Measured on a 2-core VM, 32 consecutive positions of 512
# components (period 204,800): 13 ms vectorised, 0.2 ms walked; at 8 components both are
# about 0.1 ms.
WALK_COMPONENTS = 8


def check_weights(weights: Sequence[Any] | None, count: int) -> list[Any] | None:
    """Checks ``weights`` (one finite, positive real per dataset) and returns them as a list.

    Raises:
        TypeError: a weight is not a real number.
        ValueError: wrong number of weights, a zero, negative, infinite or NaN weight.
    """
    if weights is None:
        return None
    weights = list(weights)
    if len(weights) != count:
        raise ValueError(
            f"got {len(weights)} weights for {count} datasets; pass one weight per dataset"
        )
    for i, w in enumerate(weights):
        if isinstance(w, bool) or not isinstance(w, numbers.Real):
            raise TypeError(f"weights[{i}] must be a number, got {w!r} of type {type(w).__name__}")
        if not math.isfinite(w) or w <= 0:
            raise ValueError(
                f"weights[{i}] is {w!r}; weights must be finite and > 0, as in Grain (they "
                f"are normalised, so pass e.g. [0.3, 0.7] or [3, 7]; leave a dataset out "
                f"rather than giving it weight 0)"
            )
    return weights


def grain_proportions(weights: Sequence[Any] | None, count: int) -> list[int]:
    """The integer proportions Grain mixes by: ``int(w * (100 / min(weights)))`` each.

    The arithmetic is Grain's own (floats for float weights), so the proportions, and
    with them the order, are Grain's; ``None`` gives ``[1] * count``.

    Raises:
        TypeError, ValueError: as :func:`check_weights`; ValueError also for weights so
            far apart that the scaled proportion is not finite.
    """
    checked = check_weights(weights, count)
    if checked is None:
        return [1] * count
    scale = 100 / min(checked)
    proportions = []
    for i, w in enumerate(checked):
        scaled = w * scale
        if not math.isfinite(scaled):
            raise ValueError(
                f"weights[{i}] is {w!r}, {scaled} times the smallest weight once scaled to "
                f"100; bring the weights closer together"
            )
        proportions.append(int(scaled))
    return proportions


class MixSchedule:
    """Which component, and which of its elements, sits at each position of a mixture.

    Args:
        weights: one positive weight per component, or ``None`` for equal weights
            together with ``count``.
        count: the number of components when ``weights`` is None.

    Attributes:
        counts: draws of each component per period (Grain's integer proportions).
        period: ``sum(counts)``.
    """

    def __init__(self, weights: Sequence[Any] | None, count: int | None = None) -> None:
        if weights is None and (count is None or count < 1):
            raise ValueError("pass weights, or the number of components to mix equally")
        n = int(count) if count is not None else len(weights)  # type: ignore[arg-type]
        self._build(grain_proportions(weights, n))

    def _build(self, counts: list[int]) -> None:
        self.counts = counts
        self.period = sum(counts)
        # rest[c]: the total of components c, c+1, ... (the period of level c)
        self._rest = [sum(counts[c:]) for c in range(len(counts))]
        self._table: tuple[np.ndarray, np.ndarray] | None = None
        self._counts = np.asarray(counts, dtype=np.int64)
        # The layout depends on the ratios p_c / rest_c only, so proportions with a common
        # factor g repeat a layout g times shorter: Grain's [100, 200] is [1, 2] repeated.
        g = math.gcd(*counts)
        self._reduced = MixSchedule.__new__(MixSchedule) if g > 1 else self
        if g > 1:
            self._reduced._build([c // g for c in counts])

    def __len__(self) -> int:
        return len(self.counts)

    def locate_one(self, position: int) -> tuple[int, int]:
        """``(component, index within the component)`` of one position (Python ints)."""
        q, r = divmod(int(position), self.period)
        a = r
        for c, (p, rest) in enumerate(zip(self.counts[:-1], self._rest)):
            # a, a + 1 positions of level c hold ceil(a * p / rest) draws of component c
            na, nb = a * (rest - p) // rest, (a + 1) * (rest - p) // rest
            if a - na != a + 1 - nb:
                return c, q * p + a - na
            a = na
        return len(self.counts) - 1, q * self.counts[-1] + a

    def locate(self, positions: Any, *, lay_out: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """``(component, index within the component)`` of each position (int64 arrays).

        A period of up to :data:`LOOKUP_PERIOD` positions (once common factors of the
        proportions are taken out) is laid out once and read by index (3 numpy calls
        instead of ~8 per component); longer ones are computed, or walked from
        :data:`WALK_COMPONENTS` components on. ``lay_out=False`` never lays a period
        out (for a caller that reads fewer positions than a period once: a weight
        schedule's short pieces).
        """
        if self._reduced is not self:
            return self._reduced.locate(positions, lay_out=lay_out)
        if not lay_out and self._table is None:
            return self._walk(positions) if len(self.counts) >= WALK_COMPONENTS else self._compute(positions)
        if self.period > LOOKUP_PERIOD:
            if len(self.counts) >= WALK_COMPONENTS:
                return self._walk(positions)
            return self._compute(positions)
        pos = np.asarray(positions, dtype=np.int64)
        table, rank = self._laid_out()
        q, r = np.divmod(pos, self.period)
        comp = table[r]
        return comp, q * self._counts[comp] + rank[r]

    def _compute(self, positions: Any) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`locate` by the nested rule, position by position (vectorised)."""
        pos = np.asarray(positions, dtype=np.int64)
        q, r = np.divmod(pos, self.period) if self.period < 2**62 else (pos * 0, pos)
        a = r if self.period <= _INT64_SAFE else r.astype(object)
        comp = np.full(pos.shape, len(self.counts) - 1, dtype=np.int64)
        idx = np.zeros(pos.shape, dtype=a.dtype)
        open_ = np.ones(pos.shape, dtype=bool)
        for c, (p, rest) in enumerate(zip(self.counts[:-1], self._rest)):
            na, nb = a * (rest - p) // rest, (a + 1) * (rest - p) // rest
            hit = open_ & (a - na != a + 1 - nb)
            comp[hit] = c
            idx[hit] = (a - na)[hit]
            open_ &= ~hit
            a = na
        idx[open_] = a[open_]
        counts = np.asarray(self.counts, dtype=object if self.period > _INT64_SAFE else np.int64)
        return comp, (q * counts[comp] + idx).astype(np.int64)

    def _walk(self, positions: Any) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`locate` by walking each run of consecutive positions down the levels.

        At level ``c`` a run is a range ``[lo, hi)`` of that level's positions; component
        ``c`` holds the draws ``k`` at ``k * rest // p`` for ``k`` in ``[H(lo), H(hi))``
        with ``H(a) = ceil(a * p / rest)``, and the other positions of the run are the
        range ``[lo - H(lo), hi - H(hi))`` of level ``c + 1``, in order. So a run costs
        O(1) a level plus its draws, in Python integers (exact for any period).
        """
        pos = np.asarray(positions, dtype=np.int64).reshape(-1)
        comp = np.empty(pos.shape, dtype=np.int64)
        idx = np.empty(pos.shape, dtype=np.int64)
        if not pos.size:
            return comp, idx
        order = np.argsort(pos, kind="stable")
        ordered = pos[order].tolist()
        where = order.tolist()
        counts, rests, last = self.counts, self._rest, len(self.counts) - 1
        start = 0
        while start < len(ordered):
            q, r0 = divmod(ordered[start], self.period)
            end = start + 1  # the run: consecutive positions (repeats too) in one period
            while end < len(ordered) and ordered[end] - ordered[end - 1] <= 1 \
                    and ordered[end] - ordered[start] < self.period - r0:
                end += 1
            r1 = ordered[end - 1] - q * self.period + 1
            # survivors[j]: the level-0 offset (from r0) of the run's j-th position at this level
            survivors = list(range(r1 - r0))
            found: dict[int, tuple[int, int]] = {}
            lo, hi = r0, r1
            for c in range(last):
                p, rest = counts[c], rests[c]
                h_lo, h_hi = -(-lo * p // rest), -(-hi * p // rest)
                if h_hi > h_lo:
                    hits = [k * rest // p - lo for k in range(h_lo, h_hi)]
                    for k, j in zip(range(h_lo, h_hi), hits):
                        found[survivors[j]] = (c, q * p + k)
                    for j in reversed(hits):
                        del survivors[j]
                lo, hi = lo - h_lo, hi - h_hi
                if lo == hi:
                    break
            for j, offset in enumerate(survivors):
                found[offset] = (last, q * counts[last] + lo + j)
            for i in range(start, end):
                c, k = found[ordered[i] - q * self.period - r0]
                comp[where[i]], idx[where[i]] = c, k
            start = end
        return comp, idx

    def position_of(self, component: int, k: int) -> int:
        """The position of component ``component``'s ``k``-th draw (0-based)."""
        p = self.counts[component]
        q, r = divmod(int(k), p)
        rest = self._rest[component]
        j = r * rest // p  # the r-th draw of component c sits here in level c
        for c in range(component - 1, -1, -1):
            # the j-th position of level c + 1 is the j-th position of level c that
            # component c does not take
            rest, p_c = self._rest[c], self.counts[c]
            j = -(-(j + 1) * rest // (rest - p_c)) - 1
        return q * self.period + j

    @property
    def table(self) -> np.ndarray:
        """The component of each position of one period (for periods up to 2**20)."""
        return self._laid_out()[0]

    @property
    def rank(self) -> np.ndarray:
        """Each position's index within its component, over one period."""
        return self._laid_out()[1]

    def _laid_out(self) -> tuple[np.ndarray, np.ndarray]:
        if self._table is None:
            if self.period > MAX_TABLE:
                raise ValueError(
                    f"this mixture's period is {self.period} positions (proportions "
                    f"{self.counts}), too long to lay out; use locate(positions)"
                )
            self._table = self._compute(np.arange(self.period, dtype=np.int64))
        return self._table

    def grain_map_length(self, lengths: Sequence[int | None]) -> int:
        """The length Grain gives ``MapDataset.mix`` of components of these lengths.

        Grain computes ``int(min(len_c / (p_c / S)))`` in floats (an infinite
        component counts as ``sys.maxsize``): the components' elements each appear at
        most about once, though a later component may be asked for one element past
        its end near the boundary (Grain's sources wrap such an index around).
        """
        maxsize = 2**63 - 1
        # (a component of weight 0, which Grain refuses, never runs out)
        ends = [(maxsize if n is None else n) / (p / self.period) for n, p in zip(lengths, self.counts) if p]
        return min(maxsize, int(min(ends)))

    def describe(self) -> list[str]:
        """Each component's share ``p_c/S``, unreduced (part of a state's signature)."""
        return [f"{p}/{self.period}" for p in self.counts]

    def __reduce__(self):  # small to pickle: the proportions
        return (_rebuild, (list(self.counts),))


def _rebuild(counts: list[int]) -> MixSchedule:
    schedule = object.__new__(MixSchedule)
    schedule._build(counts)
    return schedule


def parse_mixture_spec(spec: str) -> list[tuple[str, float]]:
    """Parses ``"pattern:weight;pattern:weight"`` into (pattern, normalised weight) pairs.

    Example:
        >>> parse_mixture_spec("gs://b/a*.array_record:1;b*.array_record:3")
        [('gs://b/a*.array_record', 0.25), ('b*.array_record', 0.75)]

    Raises:
        ValueError: an empty spec or part, a part without ``:weight``, or a bad weight.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(
            f"mixture spec must be a non-empty string such as "
            f"'a*.array_record:0.3;b*.array_record:0.7', got {spec!r}"
        )
    parts = []
    for i, part in enumerate(spec.split(";")):
        pattern, sep, weight = part.strip().rpartition(":")
        if not sep or not pattern or "/" in weight:
            raise ValueError(
                f"part {i} of the mixture spec ({part!r}) has no weight; write each part "
                f"as 'pattern:weight', e.g. 'a*.array_record:0.3'"
            )
        try:
            value = float(weight)
        except ValueError:
            raise ValueError(
                f"part {i} of the mixture spec ({part!r}) has weight {weight!r}, which is "
                f"not a number; write e.g. 'a*.array_record:0.3'"
            ) from None
        parts.append((pattern, value))
    weights = check_weights([w for _, w in parts], len(parts)) or []
    total = sum(weights)
    return [(pattern, w / total) for (pattern, _), w in zip(parts, weights)]
