"""Units sized by what they cost: how many positions the next work unit covers.

With the default unit size (no ``ReadOptions(unit_size=...)``, and no batch or a
filter/flat map before it), a stream's first unit is one position: an unbatched
pipeline's first element costs about one element, whatever an element costs. Units
then grow, doubling, while their elements are cheap and small, and stop where a unit
would take longer than :data:`UNIT_SECONDS` to compute or hold more than
:data:`UNIT_BYTES` of results (per-position costs measured on the units already
finished), never past :data:`MAX_UNIT_POSITIONS`. So a worker's buffer holds a bounded
amount of memory, and cheap elements still travel in units big enough to amortise the
per-unit overhead (a message, a shared-memory block, a wake-up).

Sizing never changes the output or the states. A unit's result is a pure function of
its range; the loader's state is defined on the *grid* of the plan's ``unit_size``
(the units of a fixed size, see :mod:`~dataloader.engine.assemble`), so it is the same
whatever ranges were computed. An adaptive unit stays inside one grid block while it is
smaller than a block, and covers whole blocks once it is larger. Only the ranges
depend on timing; the pool stores each unit's range when it is made, so a unit lost
with a dead worker is computed again over the very same range.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import numpy as np

# A unit should take at most about this long to compute: long enough that the fixed
# cost of a unit (about 0.1-0.5 ms through the pool) is noise, short enough that a
# consumer computing units in its own thread never waits long for one.
UNIT_SECONDS = 0.05
# A unit's results should hold at most about this many bytes: a pool buffers
# worker_count * buffer_size units, which this bounds (with 8 MB elements, 128-element
# units were 1 GB each).
UNIT_BYTES = 16 * 2**20
# Cheap small elements stop growing here: past a few thousand positions a unit's fixed
# cost is already below a microsecond per element.
MAX_UNIT_POSITIONS = 2048
# Weight of the newest unit in the running per-position costs.
_SMOOTHING = 0.5
# Outputs of a unit whose sizes are measured (first, middle, last): elements of one
# stream are usually alike, and measuring all of them would cost per element.
_SAMPLES = 3
_NESTED = 64  # containers longer than this are measured on a sample too


def element_bytes(x: Any) -> int:
    """About how many bytes ``x`` holds: arrays' buffers, strings, containers' items.

    Cheap and approximate (a sample of long containers), for sizing units only.
    """
    if isinstance(x, np.ndarray):
        return int(x.nbytes)
    if isinstance(x, (bytes, bytearray, str, memoryview)):
        return len(x)
    if isinstance(x, dict):
        return _sampled(list(x.values()))
    if isinstance(x, (list, tuple)):
        return _sampled(x)
    nbytes = getattr(x, "nbytes", None)  # jax/torch-like arrays
    if isinstance(nbytes, (int, np.integer)):
        return int(nbytes)
    return sys.getsizeof(x)


def _sampled(items: Any) -> int:
    n = len(items)
    if n <= _NESTED:
        return sum(element_bytes(v) for v in items)
    picks = (0, n // 2, n - 1)
    return int(sum(element_bytes(items[i]) for i in picks) / len(picks) * n)


def result_bytes(outputs: list[Any]) -> float:
    """About how many bytes a unit's ``outputs`` hold (a few of them measured)."""
    n = len(outputs)
    if not n:
        return 0.0
    picks = sorted({0, n // 2, n - 1})[:_SAMPLES]
    return sum(element_bytes(outputs[i]) for i in picks) / len(picks) * n


def unit_outputs(element_bytes: float) -> int:
    """The most elements of ``element_bytes`` each that a unit sized by cost holds:
    :data:`UNIT_BYTES` of them, at least one, at most :data:`MAX_UNIT_POSITIONS`."""
    if element_bytes <= 0:
        return MAX_UNIT_POSITIONS
    return max(1, min(MAX_UNIT_POSITIONS, int(UNIT_BYTES // element_bytes)))


class UnitSizer:
    """Chooses each next unit's size from the per-position costs of finished units.

    Pure bookkeeping, fed by :meth:`observe` (the executor, as units finish) and asked
    by :meth:`next_size` (the unit ranges, as units are made); tests inject costs.

    Args:
        cap: the most positions a unit may cover.
        seconds, nbytes: a unit's targets (compute time, bytes of results).
    """

    def __init__(self, cap: int = MAX_UNIT_POSITIONS, seconds: float = UNIT_SECONDS, nbytes: float = UNIT_BYTES) -> None:
        if cap < 1:
            raise ValueError(f"UnitSizer cap must be >= 1 position, got {cap!r}")
        self.cap = cap
        self._seconds, self._bytes = seconds, nbytes
        self._last = 0  # size of the last unit made; 0: none yet
        # Running seconds and bytes per position; None: no unit finished yet.
        self._s: float | None = None
        self._b: float | None = None

    def observe(self, positions: int, seconds: float, nbytes: float) -> None:
        """A unit of ``positions`` finished in ``seconds`` with ``nbytes`` of results."""
        if positions <= 0:
            return
        s, b = max(seconds, 0.0) / positions, max(nbytes, 0.0) / positions
        if self._s is None or self._b is None:
            self._s, self._b = s, b
        else:
            self._s += _SMOOTHING * (s - self._s)
            self._b += _SMOOTHING * (b - self._b)

    def desired(self) -> int:
        """The size the costs measured so far allow (1 before any unit finished)."""
        if self._s is None or self._b is None:
            return 1
        size = float(self.cap)
        if self._s > 0:
            size = min(size, self._seconds / self._s)
        if self._b > 0:
            size = min(size, self._bytes / self._b)
        return max(1, int(size))

    def next_size(self) -> int:
        """The next unit's size: at most twice the last one's, shrinking at once."""
        size = self.desired() if not self._last else min(self.desired(), 2 * self._last)
        self._last = size
        return size


class Units(Iterator[tuple[int, int]]):
    """A stream's unit ranges ``(start, stop)``, in order; :meth:`observe` hears each
    finished unit's result (fixed-size units ignore it)."""

    def __init__(self, ranges: Iterator[tuple[int, int]], sizer: UnitSizer | None = None) -> None:
        self._ranges = ranges
        self.sizer = sizer

    def __iter__(self) -> Units:
        return self

    def __next__(self) -> tuple[int, int]:
        return next(self._ranges)

    def observe(self, result: Any) -> None:
        """Hears a finished :class:`~dataloader.engine.compute.UnitResult`."""
        if self.sizer is not None:
            self.sizer.observe(
                result.stop - result.start, result.ended - result.began, result_bytes(result.outputs)
            )


def sized_ranges(position: int, end: int | None, grid: int, sizer: UnitSizer) -> Iterator[tuple[int, int]]:
    """Ranges from ``position`` to ``end`` (None: for ever), each ``sizer.next_size()``
    positions or fewer: a unit smaller than ``grid`` stays inside its grid block
    ``[k*grid, (k+1)*grid)``; a larger one starts on the grid and covers whole blocks.
    """
    start = position
    while end is None or start < end:
        size = sizer.next_size()
        block_end = (start // grid + 1) * grid
        if size >= grid and start % grid == 0:
            stop = start + size // grid * grid
        else:
            stop = min(start + size, block_end)
        if end is not None:
            stop = min(stop, end)
        yield start, stop
        start = stop
