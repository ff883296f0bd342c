"""One random-access source over several: the key space the index maps point into.

Part ``j`` owns keys ``[offsets[j], offsets[j + 1])``. A ``__getitems__`` call reads each
part's keys with one call to that part (through :func:`sources.read_records`, so a part's
own ``__getitems__`` is used) and puts the records back in the order asked.

A part in ``unbounded`` (a ``map_with_index`` sub-chain, see
:class:`~dataloader.dataset.compile.index_map.IndexedLeaf`) also takes keys past the end:
key ``k`` is its key ``k % len(self) - offsets[j]`` in pass ``k // len(self)``, handed to
it as ``that + pass * len(part)``.

With ``tagged=True`` each record comes back as ``(part, record)``, so that operations
that belong to some parts only (a ``map`` applied to one component of a mixture) can
tell where an element came from; the compiled pipeline strips the tag again.

Example:
    >>> src = ConcatSource([["a", "b"], ["c"]])
    >>> len(src), src.__getitems__([2, 0]), ConcatSource([["a"], ["c"]], tagged=True)[1]
    (3, ['c', 'a'], (1, 'c'))
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence
from typing import Any, SupportsIndex

import numpy as np

from dataloader.sources import HintedDataSource, read_records


class ConcatSource:
    """Concatenates random-access sources (the same source may appear more than once)."""

    def __init__(self, parts: Sequence[Any], *, tagged: bool = False, unbounded: frozenset[int] = frozenset()) -> None:
        self.parts = list(parts)
        self.tagged = tagged
        self.unbounded = unbounded
        self.offsets = np.concatenate([[0], np.cumsum([len(p) for p in self.parts])]).astype(np.int64)
        self._hinted = [isinstance(p, HintedDataSource) and p.takes_hints for p in self.parts]

    @property
    def takes_hints(self) -> bool:
        """Whether a part takes hints (``HintedDataSource``: a remote one)."""
        return any(self._hinted)

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def _check(self, keys: np.ndarray) -> np.ndarray:
        """The pass of each key (0 but for the keys of unbounded parts)."""
        passes, rest = np.divmod(keys, len(self)) if len(self) else (np.zeros_like(keys), keys)
        bad = keys[(keys < 0) | ((passes > 0) & ~np.isin(self._part(rest), list(self.unbounded)))]
        if bad.size:
            raise IndexError(f"record index {int(bad[0])} is out of range for a source of length {len(self)}")
        return passes

    def _part(self, keys: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.offsets, keys, side="right") - 1

    def __getitem__(self, index: SupportsIndex) -> Any:
        return self.__getitems__([operator.index(index)])[0]

    def __getitems__(self, indices: Sequence[int] | np.ndarray) -> list[Any]:
        keys = np.asarray(indices, dtype=np.int64).reshape(-1)
        passes = self._check(keys)
        if not keys.size:
            return []
        if passes.any():
            keys = keys - passes * len(self)
        which = self._part(keys)
        # Group by part with one stable sort (not a pass over the keys per part: a batch
        # of a mixture of many sources touches a part or two per record).
        order = np.argsort(which, kind="stable")
        ranked = which[order]
        cuts = [0, *(np.flatnonzero(ranked[1:] != ranked[:-1]) + 1).tolist(), keys.size]
        local_keys = keys - self.offsets[which]
        if self.unbounded and passes.any():
            # an unbounded part reads its own later passes (Grain's index, whole)
            grow = np.isin(which, list(self.unbounded))
            local_keys = local_keys + np.where(grow, passes * np.diff(self.offsets)[which], 0)
        where, local, parts = order.tolist(), local_keys.tolist(), ranked.tolist()
        out: list[Any] = [None] * keys.size
        for start, stop in itertools.pairwise(cuts):
            j, group = parts[start], where[start:stop]
            records = read_records(self.parts[j], [local[i] for i in group])
            if self.tagged:
                records = [(j, r) for r in records]
            for i, r in zip(group, records):
                out[i] = r
        return out

    def prefetch(self, indices: Sequence[int] | np.ndarray) -> None:
        """Passes a hint of records to come to each part that takes hints (``prefetch``)."""
        keys = np.asarray(indices, dtype=np.int64).reshape(-1)
        keys = keys[(keys >= 0) & (keys < len(self))]
        which = self._part(keys)
        for j in np.unique(which).tolist():
            if self._hinted[j]:
                self.parts[j].prefetch(keys[which == j] - self.offsets[j])

    def __repr__(self) -> str:
        inner = ", ".join(repr(p) for p in self.parts)
        return f"ConcatSource([{inner}]{', tagged=True' if self.tagged else ''})"
