"""Weighted mixing of several streams: a periodic schedule that is a pure function of position.

Weights become integer counts ``m_c`` over a period of ``M = sum(m_c)`` positions
(exactly, for weights that are simple fractions such as 0.3/0.7 -> 3/7 of 10). One
period is laid out once by Tijdeman's algorithm for the "chairman assignment problem"
(R. Tijdeman, 1980): slot ``t`` goes, among the components at least ``s = 1/(2k-2)`` of a
draw behind their share ``t * m_c / M``, to the one whose next draw is due first (the
smallest ``(count_c + 1 - s) / m_c``; ties to the lower index). So:

* any ``M`` consecutive positions hold exactly ``m_c`` draws of component ``c``;
* in every prefix the count of ``c`` stays within ``1 - 1/(2k-2)`` of its share, and in
  every window within twice that (the tests check both over random weights);
* position ``i`` maps to ``(c, k)``, the ``k``-th draw of component ``c``, in O(1):
  ``q, r = divmod(i, M)``, ``c = table[r]``, ``k = q * m_c + rank[r]``.

The state of a mixture is therefore still a single position. Spec strings as MaxText
writes them, ``"a*.array_record:0.3;b*.array_record:0.7"``, are parsed by
:func:`parse_mixture_spec` (the weight follows the last ``:``, so paths such as
``gs://...`` keep theirs).

Example:
    >>> s = MixSchedule([0.3, 0.7])
    >>> s.period, s.table.tolist()
    (10, [1, 0, 1, 1, 0, 1, 1, 1, 0, 1])
"""

from __future__ import annotations

import heapq
import math
import numbers
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import numpy as np

# Longest period laid out; weights whose exact period is longer are rounded to it
# (largest remainder), i.e. to within 1/65536 of their share.
MAX_PERIOD = 2**16
# Weights are read as the nearest fraction with a denominator up to this, so 0.3
# is 3/10 and 1/3 (as a float) is 1/3.
_MAX_DENOMINATOR = 10**6


def normalize_weights(weights: Sequence[Any] | None, count: int) -> list[Fraction]:
    """Checks ``weights`` and returns them as exact fractions summing to 1.

    Raises:
        TypeError: a weight is not a real number.
        ValueError: wrong number of weights, a zero, negative, infinite or NaN weight.
    """
    if weights is None:
        return [Fraction(1, count)] * count
    weights = list(weights)
    if len(weights) != count:
        raise ValueError(
            f"got {len(weights)} weights for {count} datasets; pass one weight per dataset"
        )
    fractions: list[Fraction] = []
    for i, w in enumerate(weights):
        if isinstance(w, bool) or not isinstance(w, numbers.Real):
            raise TypeError(f"weights[{i}] must be a number, got {w!r} of type {type(w).__name__}")
        if not math.isfinite(w) or w <= 0:
            raise ValueError(
                f"weights[{i}] is {w!r}; weights must be finite and > 0, as in Grain (they "
                f"are normalised to sum to 1, so pass e.g. [0.3, 0.7] or [3, 7]; leave a "
                f"dataset out rather than giving it weight 0)"
            )
        exact = w if isinstance(w, Fraction) else Fraction(float(w))
        fractions.append(exact.limit_denominator(_MAX_DENOMINATOR))
    if not all(fractions):
        tiny = [w for w, f in zip(weights, fractions) if not f]
        raise ValueError(
            f"weights {tiny} are too small beside the others (below 1/{_MAX_DENOMINATOR}) "
            f"to be drawn; raise them or leave those datasets out"
        )
    total = sum(fractions)
    return [f / total for f in fractions]


def integer_counts(shares: Sequence[Fraction], max_period: int = MAX_PERIOD) -> list[int]:
    """Integer counts per period for shares summing to 1 (exact when the period fits)."""
    period = math.lcm(*(s.denominator for s in shares))
    if period <= max_period:
        return [int(s * period) for s in shares]
    exact = [s * max_period for s in shares]
    counts = [math.floor(x) for x in exact]
    by_remainder = sorted(range(len(shares)), key=lambda c: (-(exact[c] - counts[c]), c))
    for c in by_remainder[: max_period - sum(counts)]:
        counts[c] += 1
    return counts


class MixSchedule:
    """Which component, and which of its elements, sits at each position of a mixture.

    Args:
        weights: one non-negative weight per component (normalised), or ``None`` for
            equal weights together with ``count``.
        count: the number of components when ``weights`` is None.

    Attributes:
        counts: draws of each component per period.
        period: ``sum(counts)``.
        table: the component of each slot of the period.
        rank: how many earlier slots of the period went to the same component.
    """

    def __init__(self, weights: Sequence[Any] | None, count: int | None = None) -> None:
        if weights is None and (count is None or count < 1):
            raise ValueError("pass weights, or the number of components to mix equally")
        n = int(count) if count is not None else len(weights)  # type: ignore[arg-type]
        self._build(normalize_weights(weights, n))

    def _build(self, shares: list[Fraction]) -> None:
        n = len(shares)
        self.shares = shares
        self.counts = integer_counts(self.shares)
        self.period = sum(self.counts)
        table = _layout(self.counts)
        rank = np.empty(self.period, dtype=np.int64)
        self._slots: list[np.ndarray] = []
        for c in range(n):
            where = np.flatnonzero(table == c)
            rank[where] = np.arange(where.size)
            self._slots.append(where)
        self.table, self.rank = table, rank
        self._m = np.asarray(self.counts, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.counts)

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(component, index within the component)`` of each position (int64 arrays)."""
        q, r = np.divmod(positions, self.period)
        comp = self.table[r]
        return comp, q * self._m[comp] + self.rank[r]

    def position_of(self, component: int, k: int) -> int:
        """The position of component ``component``'s ``k``-th draw (it must have weight)."""
        q, r = divmod(k, self.counts[component])
        return q * self.period + int(self._slots[component][r])

    def describe(self) -> list[str]:
        return [str(s) for s in self.shares]

    def __reduce__(self):  # rebuild from the exact shares: small to pickle, same table
        return (_rebuild, ([(s.numerator, s.denominator) for s in self.shares],))


def _layout(counts: list[int]) -> np.ndarray:
    """One period of Tijdeman's schedule, O(M log k) with two heaps.

    A component's release time (when it is ``s`` behind) and its due time depend only on
    its own count, so each changes only when the component is drawn.
    """
    k, period = len(counts), sum(counts)
    active = [c for c in range(k) if counts[c]]
    table = np.full(period, active[0], dtype=np.int64)
    if len(active) == 1:
        return table
    d = 2 * len(active) - 2  # s = 1/d; eligible at slot t (1-based) when d*(t*m - n*M) >= M

    def release(c: int, n: int) -> int:
        return -(-(d * n + 1) * period // (d * counts[c]))

    def due(c: int, n: int) -> Fraction:
        return Fraction((n + 1) * d - 1, counts[c])

    drawn = [0] * k
    waiting = [(release(c, 0), c) for c in active]
    heapq.heapify(waiting)
    ready: list[tuple[Fraction, int]] = []
    for t in range(1, period + 1):
        while waiting and waiting[0][0] <= t:
            _, c = heapq.heappop(waiting)
            heapq.heappush(ready, (due(c, drawn[c]), c))
        _, c = heapq.heappop(ready)  # never empty: Tijdeman's theorem
        table[t - 1] = c
        drawn[c] += 1
        heapq.heappush(waiting, (release(c, drawn[c]), c))
    return table


def _rebuild(shares: list[tuple[int, int]]) -> MixSchedule:
    schedule = object.__new__(MixSchedule)
    schedule._build([Fraction(a, b) for a, b in shares])  # exactly the shares, not re-rounded
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
    shares = normalize_weights([w for _, w in parts], len(parts))
    return [(pattern, float(share)) for (pattern, _), share in zip(parts, shares)]
