"""The elements a parent ships to its workers: units of an iterated stage, through memory.

A stage that has no random-access form can only be iterated in the training process;
the element-wise operations after it still run on the worker pool
(:mod:`dataloader.engine.stages.shipped`). This module is how their inputs travel: the
parent pickles a unit's elements once (protocol 5, numpy payloads out of band, with the
pool's own payload layout, :func:`~dataloader.engine.pool.shm.write_payload`) into a
``memfd`` of its own, and notes ``(start, count, fd)`` in a small shared table
(:class:`ShippedInputs`). A worker asked for positions ``[start, stop)`` looks the unit
up in the table and maps the parent's ``memfd`` through ``/proc/<parent>/fd/<fd>``,
copy on write (so user code may write into the arrays it receives). Nothing has a name:
when the parent ends, however it ends, the kernel frees the memory. The parent keeps a
unit's elements until the consumer has taken its result, so a unit lost with a killed
worker is sent again over the same elements.

In the training process (``worker_count=0``) the same table hands out the elements
themselves, without pickling.
"""

from __future__ import annotations

import mmap
import os
from typing import Any

import numpy as np

from dataloader.engine.pool.shm import (
    ALIGN,
    dumps,
    new_memfd,
    payload_size,
    read_payload,
    round_up,
    write_payload,
)

# Units alive at once (in flight, buffered, being handed out) stay far below this; the
# table is keyed by unit number modulo it.
_SLOTS = 4096


def write_elements(elements: list[Any]) -> tuple[int, int]:
    """Pickles ``elements`` into a new ``memfd``; returns its descriptor and size.

    Layout: the number of ``(offset, length)`` pairs (one int64), the pairs, then at
    the next aligned offset the payload :func:`~dataloader.engine.pool.shm.write_payload`
    writes (pickle header and out-of-band buffers, aligned), offsets relative to it.
    """
    header, buffers = dumps(elements)
    count = 1 + len(buffers)
    at = round_up(8 + 16 * count, ALIGN)
    size = max(at + payload_size(header, buffers), ALIGN)
    fd = new_memfd("granary-inputs")
    try:
        os.ftruncate(fd, size)
        with mmap.mmap(fd, size) as target:
            view = memoryview(target)
            try:
                layout = write_payload(view[at:], header, buffers)
                target[0 : 8 + 16 * count] = np.asarray([count, *np.ravel(layout)], dtype=np.int64).tobytes()
            finally:
                view.release()
    except BaseException:
        os.close(fd)
        raise
    return fd, size


def read_elements(path: str) -> list[Any]:
    """The elements :func:`write_elements` wrote, mapped copy on write from ``path``."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        mapped = mmap.mmap(fd, size, access=mmap.ACCESS_COPY)
    finally:
        os.close(fd)
    base = np.frombuffer(mapped, dtype=np.uint8)
    count = int(np.frombuffer(base[:8], dtype=np.int64)[0])
    layout = np.frombuffer(base[8 : 8 + 16 * count], dtype=np.int64).reshape(count, 2).tolist()
    # The arrays view the mapping, which stays alive while one of them does.
    return read_payload(base[round_up(8 + 16 * count, ALIGN) :], [(o, n) for o, n in layout])


class ShippedInputs:
    """The data source of a shipped stream: the elements of the units alive.

    In the parent, :meth:`put` adds a unit's elements (and ships them when
    ``shared``), :meth:`drop` frees them. Pickled (for the workers) it keeps only the
    parent's pid and the table's descriptor: a worker reads each unit from the parent's
    shared memory.

    Args:
        unit_size: the grid of units (no unit crosses a multiple of it).
        shared: ship units to other processes (worker pool), not only keep them here.
    """

    def __init__(self, unit_size: int, shared: bool) -> None:
        self.unit_size = unit_size
        self._local: dict[int, tuple[int, list[Any], int]] = {}  # key -> (start, elements, fd)
        self._pid = os.getpid()
        self._table_fd = -1
        self._table: np.ndarray | None = None
        self._mapped: Any = None
        if shared:
            self._table_fd = new_memfd("granary-input-table")
            os.ftruncate(self._table_fd, _SLOTS * 3 * 8)
            self._mapped = mmap.mmap(self._table_fd, _SLOTS * 3 * 8)
            self._table = np.frombuffer(self._mapped, dtype=np.int64).reshape(_SLOTS, 3)
            self._table[:] = -1

    def __getstate__(self) -> dict[str, Any]:
        if self._table_fd < 0:
            raise TypeError("a ShippedInputs made with shared=False stays in its process")
        return {"unit_size": self.unit_size, "pid": self._pid, "table_fd": self._table_fd}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.unit_size = state["unit_size"]
        self._pid, self._table_fd = state["pid"], state["table_fd"]
        self._local, self._table, self._mapped = {}, None, None

    # -- the parent --------------------------------------------------------------------

    def put(self, start: int, elements: list[Any]) -> None:
        key = start // self.unit_size
        if key in self._local:
            raise AssertionError(f"unit at {start} is already stored")
        fd = -1
        if self._table is not None:
            slot = key % _SLOTS
            if self._table[slot, 0] >= 0 and self._table[slot, 0] // self.unit_size in self._local:
                raise RuntimeError(f"more than {_SLOTS} units of shipped elements alive at once")
            fd, _ = write_elements(elements)
            self._table[slot] = start, len(elements), fd
        self._local[key] = (start, elements, fd)

    def drop(self, start: int) -> None:
        entry = self._local.pop(start // self.unit_size, None)
        if entry is not None and entry[2] >= 0:
            os.close(entry[2])

    def drop_all(self) -> None:
        for _, _, fd in self._local.values():
            if fd >= 0:
                os.close(fd)
        self._local.clear()

    def close(self) -> None:
        self.drop_all()
        if self._table_fd >= 0 and self._mapped is not None:
            self._table = None
            self._mapped.close()
            os.close(self._table_fd)
            self._table_fd = -1

    # -- the data source -----------------------------------------------------------------

    def __len__(self) -> int:
        return 2**62  # an endless stream: the upstream ends it

    def __getitem__(self, position: int) -> Any:
        return self.__getitems__([position])[0]

    def __getitems__(self, positions: Any) -> list[Any]:
        positions = np.asarray(positions, dtype=np.int64)
        if positions.size == 0:
            return []
        first, last = int(positions[0]), int(positions[-1])
        key = first // self.unit_size
        entry = self._local.get(key)
        if entry is None and self._mapped is None and self._table_fd >= 0:
            entry = self._fetch(key, first)
        if entry is None:
            raise LookupError(f"the elements of position {first} are no longer held (a stale unit)")
        start, elements, _ = entry
        if not start <= first <= last < start + len(elements):
            raise LookupError(f"positions {first}..{last} are not in the unit at {start}")
        if positions.size != last - first + 1:
            return [elements[p - start] for p in positions.tolist()]
        return elements[first - start : last - start + 1]

    def _fetch(self, key: int, first: int) -> tuple[int, list[Any], int] | None:
        """A worker: the unit's elements, read from the parent's shared memory."""
        if self._table is None:
            path = f"/proc/{self._pid}/fd/{self._table_fd}"
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError as exc:
                raise OSError(
                    f"a worker cannot open the training process's shared memory at {path} "
                    f"({exc}); the elements after an iterated stage reach the workers through "
                    f"/proc, which this system hides; use mp_prefetch(num_workers=0) for them"
                ) from exc
            try:
                self._mapped_table = mmap.mmap(fd, _SLOTS * 3 * 8, prot=mmap.PROT_READ)
            finally:
                os.close(fd)
            self._table = np.frombuffer(self._mapped_table, dtype=np.int64).reshape(_SLOTS, 3)
        start, count, fd = self._table[key % _SLOTS].tolist()
        if start < 0 or start // self.unit_size != key:
            return None
        elements = read_elements(f"/proc/{self._pid}/fd/{fd}")
        if len(elements) != count:
            return None  # the slot was reused while it was read: a stale unit
        return start, elements, -1

    def __repr__(self) -> str:
        return f"ShippedInputs(unit_size={self.unit_size})"
