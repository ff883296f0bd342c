"""Where each worker is: four integers per worker, in memory the parent shares with it.

A worker writes its slot when it starts a unit and at each operation boundary: a few
stores into shared memory per unit, nothing per record and no message. The parent
reads the slots only while the consumer waits, to say which worker is stuck in which
unit and operation (:mod:`~dataloader.engine.pool.watch.stalls`).

The memory is a ``memfd`` that each child inherits as a file descriptor: it has no
name in ``/dev/shm``, so there is nothing to unlink, nothing to leak and nothing to
fail when ``/dev/shm`` is small; it is freed when the last process lets go of it.

A slot holds ``(generation, unit, stage, started)``: the stream and unit the worker
computes, the stage it is in (``compute.READ``, 1 + an operation's index,
:data:`SENDING`, or :data:`IDLE` once the result is sent) and when it started the unit (``time.monotonic_ns``, one clock for
all processes of the machine). The worker writes ``started`` before ``unit`` and
``generation``, so a reader that sees the new unit sees its start time.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import time
from typing import NamedTuple

from dataloader.engine.pool.shm import new_memfd

_FIELDS = 4
GENERATION, UNIT, STAGE, STARTED = range(_FIELDS)
SENDING = -1  # the stage of a worker pickling and sending its result
IDLE = -2  # the result is sent; the worker waits for its next task
ELSEWHERE = -3  # a worker that does not report its stage (a Ray actor on another node)
_WORD = 8


class Position(NamedTuple):
    """What one slot says."""

    generation: int
    unit: int
    stage: int
    started_ns: int


def _map(fd: int, workers: int) -> tuple[mmap.mmap, memoryview]:
    size = max(mmap.PAGESIZE, workers * _FIELDS * _WORD)
    if os.fstat(fd).st_size < size:
        os.ftruncate(fd, size)
    mapped = mmap.mmap(fd, size)
    return mapped, memoryview(mapped).cast("q")


class Board:
    """The parent's side: one slot per worker index (a replacement reuses its slot)."""

    def __init__(self, workers: int) -> None:
        self.fd = new_memfd("granary-progress")
        try:
            self._map, self._view = _map(self.fd, workers)
        except BaseException:
            os.close(self.fd)
            raise
        for index in range(workers):
            self.clear(index)

    def clear(self, index: int) -> None:
        """Forgets what a slot said (before a new worker takes it)."""
        base = index * _FIELDS
        self._view[base : base + _FIELDS] = memoryview(bytes(_FIELDS * _WORD)).cast("q")
        self._view[base + GENERATION] = -1

    def read(self, index: int) -> Position:
        base = index * _FIELDS
        view = self._view
        # generation and unit first: the worker writes them last.
        generation, unit = view[base + GENERATION], view[base + UNIT]
        return Position(generation, unit, view[base + STAGE], view[base + STARTED])

    def close(self) -> None:
        self._view.release()
        with contextlib.suppress(BufferError):
            self._map.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)


class Slot:
    """A worker's side: its own slot of the board it inherited as ``fd``."""

    def __init__(self, fd: int, index: int, workers: int) -> None:
        self._map, self._view = _map(fd, workers)
        os.close(fd)  # the mapping keeps the memory
        self._base = index * _FIELDS

    def begin(self, generation: int, unit: int) -> None:
        """The worker starts computing ``unit`` of stream ``generation``."""
        view, base = self._view, self._base
        view[base + STARTED] = time.monotonic_ns()
        view[base + STAGE] = 0
        view[base + UNIT] = unit
        view[base + GENERATION] = generation

    def stage(self, stage: int) -> None:
        """The worker enters ``stage`` (a :data:`~dataloader.engine.compute.Report`)."""
        self._view[self._base + STAGE] = stage
