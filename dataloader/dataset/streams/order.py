"""Stream order as arithmetic: which file and row is at each position of an interleave.

A file source over several files reads them as ``InterleaveIterDataset`` does:
``cycle_length`` slots, visited in turn; a slot yields the next row of its file, or,
when the file has ended, is emptied on that visit (yielding nothing) and opens the next
file on its next visit. Number the visits ``(round, slot)``: a file that opens at round
``r`` yields its rows at rounds ``r .. r + rows - 1`` and its slot opens the next file at
round ``r + rows + 1`` (an empty file included: it opens and ends on one visit). Files
are opened in the order of those free visits, so the whole schedule follows from the
row counts alone, and position ``p`` of the stream is the ``p``-th visit that yields.

:class:`InterleaveOrder` computes that schedule once (``O(files log cycle)``) and then
maps positions to ``(file, row)`` with a few vectorised searches, so a worker process
can read any stretch of the stream without reading what comes before it; and maps a
state of the streaming iterators (where each open file stands) back to a position.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dataloader.errors import StateMismatchError


class InterleaveOrder:
    """The positions of an interleave of files with known row counts.

    Args:
        row_counts: the rows of each file, in the order the files are opened.
        cycle_length: how many files are read at a time (1: one after another).

    Example:
        >>> order = InterleaveOrder([3, 1, 2], cycle_length=2)
        >>> [tuple(map(int, order.locate([p])[i])) for p in range(6) for i in (0,)]
        [(0,), (1,), (0,), (0,), (2,), (2,)]
    """

    def __init__(self, row_counts: Sequence[int], cycle_length: int) -> None:
        counts = np.asarray(row_counts, dtype=np.int64).reshape(-1)
        if (counts < 0).any():
            raise ValueError(f"row counts must be >= 0, got {counts.tolist()}")
        if cycle_length < 1:
            raise ValueError(f"cycle_length must be >= 1, got {cycle_length}")
        self.counts = counts
        self.cycle_length = min(cycle_length, len(counts)) or 1
        files = len(counts)
        self.start = np.zeros(files, dtype=np.int64)  # the round of each file's first row
        self.slot = np.zeros(files, dtype=np.int64)
        free = [(0, k) for k in range(self.cycle_length)]  # (round, slot) of free visits
        for f in range(files):
            r, k = heapq.heappop(free)
            self.start[f], self.slot[f] = r, k
            heapq.heappush(free, (r + int(counts[f]) + 1, k))
        self._segments()

    def _segments(self) -> None:
        """Splits the rounds where the set of yielding files is constant."""
        live = np.flatnonzero(self.counts > 0)
        end = self.start + self.counts
        bounds = np.unique(np.concatenate([self.start[live], end[live]]))
        cycle = self.cycle_length
        members = np.full((max(len(bounds) - 1, 0), cycle), -1, dtype=np.int64)
        # Files starting and ending at each boundary, swept once.
        at = {int(b): i for i, b in enumerate(bounds.tolist())}
        starts: list[list[int]] = [[] for _ in bounds]
        ends: list[list[int]] = [[] for _ in bounds]
        for f in live.tolist():
            starts[at[int(self.start[f])]].append(f)
            ends[at[int(end[f])]].append(f)
        current = np.full(cycle, -1, dtype=np.int64)  # the yielding file of each slot
        for i in range(len(bounds) - 1):
            for f in ends[i]:
                current[self.slot[f]] = -1
            for f in starts[i]:
                current[self.slot[f]] = f
            members[i] = current
        # Each segment's yielding files in slot order, packed to the left.
        active = members >= 0
        self._width = active.sum(axis=1)
        order = np.argsort(~active, axis=1, kind="stable")
        self._members = np.take_along_axis(members, order, axis=1)
        self._bounds = bounds
        lengths = self._width * np.diff(bounds) if len(bounds) > 1 else np.zeros(0, np.int64)
        self._first = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)

    def __len__(self) -> int:
        return int(self.counts.sum())

    def locate(self, positions: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The file and the row in it at each of ``positions``.

        Raises:
            IndexError: a position is outside ``[0, len(self))``.
        """
        p = np.asarray(positions, dtype=np.int64).reshape(-1)
        bad = p[(p < 0) | (p >= len(self))]
        if len(bad):
            raise IndexError(f"position {int(bad[0])} is out of range for a stream of {len(self)} rows")
        seg = np.searchsorted(self._first, p, side="right") - 1
        offset = p - self._first[seg]
        width = self._width[seg]
        rnd = self._bounds[seg] + offset // width
        files = self._members[seg, offset % width]
        return files, rnd - self.start[files]

    def position(self, consumed: dict[int, int], opened: int) -> int:
        """The position of a stream where files ``0 .. opened - 1`` were opened and file
        ``f`` of ``consumed`` has handed out ``consumed[f]`` rows (the others ended).

        Raises:
            ValueError: the numbers cannot be a point of this stream.
        """
        if not 0 <= opened <= len(self.counts):
            raise ValueError(f"{opened} files opened, but the stream has {len(self.counts)}")
        total = int(self.counts[:opened].sum())
        for f, rows in consumed.items():
            if not 0 <= f < opened or not 0 <= rows <= self.counts[f]:
                raise ValueError(f"file {f} at row {rows} is not a point of this stream")
            total -= int(self.counts[f]) - rows
        return total

    def position_of_state(self, state: dict[str, Any], file_position: Callable[[int, dict[str, Any]], int]) -> int:
        """The position at a state of ``InterleaveIterDataset`` over these files, where
        ``file_position(f, inner)`` is the rows file ``f`` handed out at its state ``inner``.

        Raises:
            StateMismatchError: the state is not a point of this stream.
        """
        open_files = zip(state["iterators_in_use_indices"], state["iterators_in_use_states"], state["exhausted"])
        consumed = {int(f): file_position(int(f), inner)
                    for f, inner, ended in open_files if inner is not None and not int(ended)}
        try:
            return self.position(consumed, int(state["next_index_in_datasets"]))
        except ValueError as error:
            raise StateMismatchError(
                f"this state does not fit this stream of {len(self.counts)} files ({error}); "
                f"restore with the files the state was made for"
            ) from None
