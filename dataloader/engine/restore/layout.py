"""Elastic restore for every pipeline: what the hosts of a new host count read next.

The global stream is positions ``g = 0, 1, 2, ...`` (docs/design.md, "The global stream"). A
*layout* says which of them are still to be read, as a finite sorted set ``E`` (the
leftovers) and everything from a frontier ``F`` on, and how ``H`` hosts share them:
the unread positions in order, ``U = sorted(E) + [F, F+1, ...]``, are dealt out
round-robin, so host ``h`` reads ``U[h], U[h+H], U[h+2H], ...``. The plain sharding is
the layout with ``E`` empty and ``F = 0`` (host ``h`` reads ``g % H == h``).

After some steps host ``h`` has used its first ``p_h`` positions (its state's
``position``; with a flat map, also ``sub_index`` outputs of position ``p_h``). Given
every old host's state, :func:`next_layout` computes the layout of what nobody used:

* ``T = max_h (h + H * p_h)``: every index ``i >= T`` of ``U`` is unread, so ``U[T:]`` is
  the new tail (the new frontier is ``F + T - |E|`` when ``T >= |E|``; otherwise the old
  leftovers ``E[T:]`` stay leftovers and the frontier stays ``F``);
* the positions below ``T`` that a host had not reached (``U[i]`` for ``i`` in host
  ``h``'s class, ``h + H * p_h <= i < T``) become leftovers;
* a position a host had begun (``sub_index > 0`` after a flat map) is a leftover that
  keeps how many of its outputs were used (``partial``): whichever new host reads it
  drops those outputs and hands out the rest.

The new ``H'`` hosts read the new ``U'`` round-robin: first the leftovers in global
order, then the positions above the frontier, interleaved. Every record of the stream
is thus read exactly once across any number of changes, and the restore is O(1) in the
stream position: the layout is stored as arithmetic progressions ``[start, step,
count]``, one per host whose reading stopped below ``T`` in the usual case (a save
after every new host read past the leftovers), so a state stays O(H) numbers and a
chain of restores (1 -> 2 -> 3 -> 1) does not grow it.

This module is the arithmetic (pure functions of integers);
:class:`~dataloader.engine.restore.samplers.ElasticSampler` reads one host's share of a
layout, and :mod:`~dataloader.engine.restore.relayout` puts a loader's engine on it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from dataloader.errors import StateMismatchError


def _runs(values: np.ndarray) -> list[list[int]]:
    """Increasing ``values`` as maximal arithmetic progressions ``[start, step, count]``."""
    out: list[list[int]] = []
    i, n = 0, len(values)
    while i < n:
        if i + 1 == n:
            out.append([int(values[i]), 1, 1])
            break
        step = int(values[i + 1] - values[i])
        j = i + 1
        while j + 1 < n and int(values[j + 1] - values[j]) == step:
            j += 1
        out.append([int(values[i]), step, j - i + 1])
        i = j + 1
    return out


def _expand(runs: Iterable[Sequence[int]]) -> np.ndarray:
    parts = [s + d * np.arange(c, dtype=np.int64) for s, d, c in runs if c > 0]
    return np.sort(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)


def span(value: Any) -> tuple[int, int | None]:
    """A feature's unused rest: an offset ``start`` (to its end) or ``[start, stop]``."""
    if isinstance(value, (list, tuple)):
        return int(value[0]), int(value[1])
    return int(value), None


def _merge(old: Any, new: Any) -> Any:
    """What is used of one output after two saves: ``None`` (all of it) or, per feature,
    where its unused rest starts (or ``[start, stop]``: a first/best-fit element whose
    first and last pieces were used); ``new`` is measured on the rest ``old`` left."""
    if old is None or new is None:
        return None
    out: dict[str, Any] = {}
    for k in {*old, *new}:
        (a, b), (c, d) = span(old.get(k, 0)), span(new.get(k, 0))
        stop = b if d is None else a + d if b is None else min(b, a + d)
        out[k] = a + c if stop is None else [a + c, stop]
    return out


class Layout:
    """The unread part of a global stream: leftovers ``E``, a frontier ``F``, and what
    was used of outputs of unread positions.

    Args:
        frontier: ``F``, every global position from it on is unread.
        extra: ``E`` as arithmetic progressions ``[start, step, count]`` below ``F``.
        partial: ``[g, sub, used]`` triples: output ``sub`` of position ``g`` (its rank
            after a flat map; 0 without one) was used, all of it (``used`` is None) or
            up to the offsets ``used = {feature: offset}`` (a concat-then-split row
            took its first tokens). Whichever host reads ``g`` drops the output, or
            hands out its rest.
    """

    def __init__(self, frontier: int = 0, extra: Sequence[Sequence[int]] = (),
                 partial: Sequence[Sequence[Any]] = ()) -> None:
        self.frontier = int(frontier)
        self.extra = [[int(s), int(d), int(c)] for s, d, c in extra if int(c) > 0]
        self.partial: dict[tuple[int, int], Any] = {}
        for g, sub, used in partial:
            self.partial[int(g), int(sub)] = None if used is None else {
                str(k): [int(v[0]), int(v[1])] if isinstance(v, (list, tuple)) else int(v) for k, v in dict(used).items()
            }
        self.leftovers = _expand(self.extra)
        if len(np.unique(self.leftovers)) != len(self.leftovers) or (
            len(self.leftovers) and (self.leftovers[0] < 0 or self.leftovers[-1] >= self.frontier)
        ):
            raise StateMismatchError(
                f"state field elastic={self.describe()} is invalid: expected leftovers that are "
                f"distinct positions in [0, frontier); pass the states get_state() returned, unchanged"
            )

    @classmethod
    def from_state(cls, described: Any) -> Layout:
        """The layout a state's ``"elastic"`` field describes (None: the plain sharding)."""
        if described is None:
            return cls()
        ok = isinstance(described, dict) and set(described) == {"frontier", "extra", "partial"}
        if ok:
            try:
                return cls(described["frontier"], described["extra"], described["partial"])
            except (TypeError, ValueError):
                pass
        raise StateMismatchError(
            f"state field elastic={str(described)[:200]} is invalid: expected a dict with "
            f"frontier, extra and partial, as get_state() makes it; pass the state unchanged"
        )

    def describe(self) -> dict[str, Any] | None:
        """The JSON-able form a state keeps (None for the plain sharding)."""
        if not self.extra and not self.frontier and not self.partial:
            return None
        partial = [[g, sub, used] for (g, sub), used in sorted(self.partial.items())]
        return {"frontier": self.frontier, "extra": self.extra, "partial": partial}

    def at(self, indices: np.ndarray) -> np.ndarray:
        """``U[i]`` for each index ``i`` of the unread positions in order."""
        n = len(self.leftovers)
        inside = indices < n
        out = self.frontier + indices - n
        if inside.any():
            out[inside] = self.leftovers[indices[inside]]
        return out

    def size(self, end: int | None) -> int | None:
        """How many unread positions a stream of ``end`` global positions has."""
        if end is None:
            return None
        return len(self.leftovers) + max(0, end - self.frontier)

    def index_of(self, g: int) -> int:
        """The index in ``U`` of global position ``g`` (which is unread)."""
        n = len(self.leftovers)
        if g >= self.frontier:
            return n + g - self.frontier
        i = int(np.searchsorted(self.leftovers, g))
        assert i < n and self.leftovers[i] == g, g
        return i


Used = Sequence[tuple[int, int, Any]]  # (local position, sub, None or offsets) of one host


def next_layout(layout: Layout, count: int, read: Sequence[tuple[int, Used]], end: int | None) -> Layout:
    """The unread part after ``count`` hosts of ``layout`` read ``read[h] = (p_h, used_h)``:
    their first ``p_h`` positions, and of later ones the outputs ``used_h`` names
    (``(q, sub, None)``: all of output ``sub`` of local position ``q``; or up to offsets).

    ``end`` is the global stream's length (None: endless); see the module docstring.
    """
    n = len(layout.leftovers)
    first = [h + count * p for h, (p, _) in enumerate(read)]  # each host's first unread index
    total = layout.size(end)
    if total is not None:
        first = [min(f, total) for f in first]
    top = max(first)
    extra: list[list[int]] = []
    for f in first:
        lag = np.arange(f, top, count, dtype=np.int64)
        if total is not None:
            lag = lag[lag < total]
        if len(lag):
            extra += _runs(layout.at(lag))
    if top < n:  # the old leftovers from U[top] on stay leftovers
        cut = int(layout.leftovers[top])
        for s, d, c in layout.extra:
            skip = min(c, max(0, -(-(cut - s) // d)))
            extra.append([s + d * skip, d, c - skip])
        frontier = layout.frontier
    else:
        frontier = layout.frontier + top - n
    partial: dict[tuple[int, int], Any] = {}
    for (g, sub), used in layout.partial.items():  # of positions still unread
        i = layout.index_of(g)
        if i // count >= read[i % count][0]:
            partial[g, sub] = used
    for h, (_, outputs) in enumerate(read):
        for q, sub, used in outputs:
            g = int(layout.at(np.array([h + count * int(q)]))[0])
            partial[g, int(sub)] = _merge(partial[g, int(sub)], used) if (g, int(sub)) in partial else used
    # Leftovers that reach up to the frontier without a gap join it: after a plain batch
    # (every host at the same position) nothing is left over, and host j of H' reads
    # frontier + j + H'*p, the same global batches as before the change.
    ends = np.sort(np.concatenate([s + d * np.arange(c, dtype=np.int64) for s, d, c in extra]) if extra else [])
    k = 0
    while k < len(ends) and ends[len(ends) - 1 - k] == frontier - 1 - k:
        k += 1
    if k:
        frontier -= k
        extra = [[s, d, min(c, max(0, -(-(frontier - s) // d)))] for s, d, c in extra]
    return Layout(frontier, extra, [(g, sub, used) for (g, sub), used in partial.items()])
