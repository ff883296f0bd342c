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
* ``weight_by="tokens"``: the job's tokens, ``H`` times this host's on ``H`` hosts
  (:mod:`~dataloader.dataset.experimental.token_mix`).

It is compiled into pieces of constant weights, and bound to its components as a
:class:`~dataloader.dataset.compile.scheduled_mix.ScheduledMix` (where each position
draws; see that module).

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
from typing import Any

from dataloader.dataset.compile.mixing import MixSchedule
from dataloader.dataset.compile.scheduled_mix import ScheduledMix

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


def bind_weights(weights: Any, count: int, keys: Sequence[str] | None, what: str) -> MixSchedule | ScheduledMix:
    """Fixed weights' :class:`MixSchedule`, or a :class:`WeightSchedule` bound to the
    ``count`` components (named ``keys`` for a dict of datasets)."""
    if isinstance(weights, WeightSchedule):
        return weights.bind(count, keys, what=what)
    return MixSchedule(weights, count)
