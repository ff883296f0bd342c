"""Record keys computed a block of positions at a time, and kept for the next calls.

A shuffle's permutation is vectorised: one call costs about the same (~100 us, measured
on the 2-core CI machine: numpy's per-call overhead over a few rounds of a Feistel
network) for 8 positions as for several hundred. The loader asks for the keys of one
work unit at a time, and a unit is often one small batch (8 positions), so computing a
block of :data:`BLOCK` aligned positions at once and slicing the next units' keys out of
it turns ~100 us per unit into ~100 us per block. The keys are the same either way: a
block is the same vectorised function over more positions.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

# Positions per block: at 8 positions a unit, one permutation call serves 128 units, and
# a block of int64 keys is 8 KiB.
BLOCK = 1024
# Blocks kept: the unit being read and the next one, and the two of a unit that
# straddles a block boundary, with room for a reader slightly ahead of them.
_KEEP = 4


class KeyBlocks:
    """The keys of ``compute(positions)`` for any positions, a block at a time.

    Args:
        compute: the keys of a sorted int64 array of valid positions (vectorised, pure).
        end: the first position past the stream (blocks stop there).

    Safe to share between threads: the kept blocks are replaced as a whole (a race may
    compute a block twice, never return wrong keys). Not pickled: an owner drops it in
    ``__getstate__`` and makes a new one.

    Example:
        >>> blocks = KeyBlocks(lambda p: p * 10, end=5000)
        >>> blocks.keys(np.array([1030, 1023]), 1023, 1030).tolist()
        [10300, 10230]
    """

    __slots__ = ("_compute", "_end", "_kept")

    def __init__(self, compute: Callable[[np.ndarray], np.ndarray], end: int) -> None:
        self._compute = compute
        self._end = end
        self._kept: dict[int, np.ndarray] = {}

    def keys(self, flat: np.ndarray, low: int, high: int) -> np.ndarray | None:
        """The keys of ``flat`` (positions in ``[low, high]``, checked by the caller), or
        None when they span more than two blocks (then one direct call is as cheap)."""
        first, last = low // BLOCK, high // BLOCK
        if last - first > 1:
            return None
        block = self._block(first)
        if last != first:
            block = np.concatenate([block, self._block(last)])
        return block[flat - first * BLOCK]

    def _block(self, number: int) -> np.ndarray:
        kept = self._kept
        found = kept.get(number)
        if found is None:
            start = number * BLOCK
            found = self._compute(np.arange(start, min(start + BLOCK, self._end), dtype=np.int64))
            kept = dict(kept)
            kept[number] = found
            while len(kept) > _KEEP:
                del kept[next(iter(kept))]
            self._kept = kept
        return found
