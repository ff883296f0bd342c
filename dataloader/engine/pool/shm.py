"""Result blocks: shared memory without a name, lent to workers, and zero-copy pickling.

A worker writes a unit's result into a block the parent lent it: the in-band pickle
(protocol 5) first, then each out-of-band buffer (numpy payloads) at a 64-byte aligned
offset. Only a few dozen bytes of layout travel through the pipe. The parent rebuilds
the result with ``pickle.loads(..., buffers=...)`` over views of the block, so arrays
are not copied; the block goes back to the pool when the last of those arrays is freed
(a ``weakref.finalize`` on the base view).

A block is a ``memfd`` (``memfd_create``): memory with no name in ``/dev/shm`` or
anywhere else. The parent makes it and hands its descriptor to a worker over the task
socket the first time it lends it to that worker (``SCM_RIGHTS``); the worker keeps the
descriptor and the mapping until the parent says the block was discarded. So there is
nothing to unlink and nothing to sweep: when every process holding a block has ended,
however it ended (``SIGKILL`` of the whole process group included), the kernel frees
it, and no process ever removes memory that another one (another job, in another PID
namespace sharing ``/dev/shm``) may be using. ``/dev/shm``'s size does not bound a
block either; memory does (the machine's and the container's, see :func:`block_room`).

Space is reserved with ``posix_fallocate`` so that a full memory is an error when a
block is made or grown (the result then travels through the pipe) rather than a
``SIGBUS`` in a worker writing into it. A worker whose result does not fit the block
it was lent grows the block itself (it holds the descriptor): the first results, sent
before any size was known, travel in blocks too.
"""

from __future__ import annotations

import collections
import contextlib
import copyreg
import ctypes
import io
import mmap
import os
import pickle
import threading
import weakref
from typing import Any

import numpy as np

ALIGN = 64
# The size of a block lent before any result was seen: small results fit it, and a
# worker grows it for a larger one (see :func:`fit`).
FIRST_SIZE = 1 << 16
_GRAIN = 1 << 16  # block sizes are multiples of it


def round_up(n: int, to: int = ALIGN) -> int:
    return (n + to - 1) // to * to


def block_size_for(nbytes: int) -> int:
    """The size of a block made for results of ``nbytes``: a quarter more, for results
    that vary, so that the next ones fit the same blocks."""
    return round_up(int(nbytes * 1.25) + ALIGN, _GRAIN)


def new_memfd(name: str) -> int:
    """A new ``memfd`` (close-on-exec) that only this user may open: mode 0600.

    ``memfd_create`` makes it 0777. Today ``/proc/<pid>/fd`` (0500, the owner's) is what
    keeps other users out; the mode makes that hold without it (a ``/proc`` mounted
    otherwise, a descriptor passed on), at the cost of one system call.
    """
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        os.fchmod(fd, 0o600)
    except BaseException:
        os.close(fd)
        raise
    return fd


def memfd_available() -> bool:
    """Whether this system makes memory without a name (Linux 3.17+, not refused by a
    seccomp filter): without it results travel through pipes."""
    if not hasattr(os, "memfd_create"):
        return False
    try:
        os.close(os.memfd_create("granary-probe", os.MFD_CLOEXEC))
    except OSError:
        return False
    return True


def block_room() -> int | None:
    """Bytes new blocks may still take: the memory this process's container (memory
    cgroup) and the machine have left, whichever is less; None when unknown.

    What bounds a ``memfd`` is memory, not ``/dev/shm``'s size: its pages are shared
    memory charged to the cgroup of the process that reserves them.
    """
    from dataloader.engine.pool.autoscale.limits import read_limits

    return read_limits().available_memory


def _reserve(fd: int, size: int) -> None:
    # ftruncate sets the size, posix_fallocate takes the pages now: a full memory fails
    # here (ENOSPC, ENOMEM) instead of as a SIGBUS when the mapping is written.
    os.ftruncate(fd, size)
    os.posix_fallocate(fd, 0, size)


class Block:
    """A result block made (and owned) by this process: a ``memfd`` and its mapping.

    Args:
        ident: the block's number in its pool (how parent and workers name it).
        size: its size in bytes.

    Raises:
        OSError: the memory could not be reserved (nothing is left behind).
    """

    def __init__(self, ident: int, size: int) -> None:
        self.ident = ident
        fd = new_memfd(f"granary-result-{ident}")
        try:
            _reserve(fd, size)
            self.mmap = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        self.size = size

    def remap(self, nbytes: int) -> None:
        """Maps the block again once a worker has grown it to hold ``nbytes``."""
        size = os.fstat(self.fd).st_size
        if size < nbytes:
            raise ValueError(f"block {self.ident} holds {size} bytes, but a result of {nbytes} bytes was written into it")
        if size > self.size:
            old, self.mmap, self.size = self.mmap, mmap.mmap(self.fd, size), size
            with contextlib.suppress(BufferError):  # no view of a lent block exists
                old.close()

    def close(self) -> None:
        """Lets go of the block: its memory is freed once no process maps it."""
        with contextlib.suppress(OSError):
            os.close(self.fd)
        # Arrays the user still holds keep the mapping alive; it closes when they go.
        with contextlib.suppress(BufferError):
            self.mmap.close()


class Mapped:
    """A worker's side of a lent block: the descriptor it received and its mapping."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.mmap = mmap.mmap(fd, os.fstat(fd).st_size)

    def fit(self, nbytes: int) -> bool:
        """Makes the mapping hold ``nbytes``: maps the block again if another worker grew
        it, else grows it (to :func:`block_size_for`). False if the memory could not be
        reserved (the result then goes through the pipe)."""
        if nbytes <= len(self.mmap):
            return True
        size = os.fstat(self.fd).st_size
        if size < nbytes:
            size = block_size_for(nbytes)
            try:
                os.posix_fallocate(self.fd, 0, size)
            except OSError:
                return False
        self.mmap.close()
        self.mmap = mmap.mmap(self.fd, size)
        return True

    def close(self) -> None:
        self.mmap.close()
        os.close(self.fd)


def _scalar(value: np.generic) -> tuple[type, tuple[Any]]:
    return type(value), (value.item(),)


# numpy scalars whose Python value (``item()``) is exact, pickled as ``type(value)`` of
# it: numpy's own reduce pickles the dtype and the raw bytes, twice the time. A Parquet
# row's np.int64 fields made half of what pickling a shipped unit cost the trainer (2.0
# against 1.0 us a row of two np.int64 and a string); the values and types unpickled
# are the same. Floats narrower than a double are left to numpy: through a Python
# float a signalling NaN would come back quiet.
_SCALARS: dict[type, Any] = {t: _scalar for t in (
    np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
    np.float64, np.complex128,
)}
# Read through, so that reducers registered with copyreg later still count.
_DISPATCH: collections.ChainMap[type, Any] = collections.ChainMap(_SCALARS, copyreg.dispatch_table)


def dumps(obj: Any) -> tuple[bytes, list[memoryview]]:
    """Pickles with protocol 5; large contiguous buffers come back out of band, numpy
    scalars as their exact Python values (see ``_SCALARS``)."""
    buffers: list[pickle.PickleBuffer] = []
    out = io.BytesIO()
    pickler = pickle.Pickler(out, protocol=5, buffer_callback=buffers.append)
    pickler.dispatch_table = _DISPATCH
    pickler.dump(obj)
    return out.getvalue(), [b.raw() for b in buffers]


def payload_size(header: bytes, buffers: list[memoryview]) -> int:
    size = round_up(len(header), ALIGN)
    for b in buffers:
        size += round_up(b.nbytes, ALIGN)
    return size


def write_payload(target: mmap.mmap | memoryview, header: bytes, buffers: list[memoryview]) -> list[tuple[int, int]]:
    """Writes header and buffers into ``target``; returns the layout ``[(offset, length)]``."""
    layout = [(0, len(header))]
    target[0 : len(header)] = header
    offset = round_up(len(header), ALIGN)
    for b in buffers:
        n = b.nbytes
        target[offset : offset + n] = b
        layout.append((offset, n))
        offset = round_up(offset + n, ALIGN)
    return layout


def read_payload(base: np.ndarray, layout: list[tuple[int, int]]) -> Any:
    """Rebuilds an object written by :func:`write_payload`, viewing ``base`` without copies."""
    (h_off, h_len), rest = layout[0], layout[1:]
    header = base[h_off : h_off + h_len].tobytes()
    return pickle.loads(header, buffers=[base[o : o + n] for o, n in rest])


class BlockPool:
    """Blocks lent to workers for results, reused instead of made per unit.

    A block is *free*, *lent* (a worker writes into it) or *leased* (arrays the user
    holds view it). ``lease`` returns a base view whose garbage collection frees the
    block. ``close`` lets go of every block. Thread-safe: finalizers run wherever the
    garbage collector does.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: list[Block] = []
        self._blocks: dict[int, Block] = {}
        self._count = 0
        self.discarded: list[int] = []  # blocks workers should unmap, in the order let go
        self.target_size = 0  # the size of new blocks; 0: no result seen yet
        self.closed = False

    def __len__(self) -> int:
        """The blocks this pool holds (free, lent or leased)."""
        return len(self._blocks)

    def note_payload(self, nbytes: int) -> None:
        """Grows the size of new blocks so results of ``nbytes`` fit, with headroom."""
        if nbytes > self.target_size:
            self.target_size = block_size_for(nbytes)

    def acquire(self) -> Block | None:
        """A free block of the target size, a new one, or ``None`` (closed: use the pipe).

        Before any result was seen, blocks of :data:`FIRST_SIZE` (workers grow them).

        Raises:
            OSError: a new block could not be made (no memory left).
        """
        with self._lock:
            if self.closed:
                return None
            size = self.target_size or FIRST_SIZE
            while self._free:
                block = self._free.pop()
                if block.size >= size:
                    return block
                self._discard(block)
            ident = self._count
            self._count += 1
        block = Block(ident, size)
        with self._lock:
            if self.closed:  # closed meanwhile: nobody will give it back
                block.close()
                return None
            self._blocks[ident] = block
        return block

    def give_back(self, block: Block) -> None:
        with self._lock:
            if self.closed or block.ident not in self._blocks:
                return
            self._free.append(block)

    def lease(self, block: Block) -> np.ndarray:
        """A view of the block that returns it to the pool once no array uses it.

        numpy collapses chains of views onto the first object that is not an array,
        so a finalizer on a numpy view would fire too early; a ctypes array is its own
        buffer exporter, and every array rebuilt over the view keeps it alive.
        """
        holder = (ctypes.c_char * block.size).from_buffer(block.mmap)
        weakref.finalize(holder, self.give_back, block)
        return np.frombuffer(holder, dtype=np.uint8)  # type: ignore[call-overload]

    def _discard(self, block: Block) -> None:
        self._blocks.pop(block.ident, None)
        self.discarded.append(block.ident)
        block.close()

    def close(self) -> None:
        with self._lock:
            self.closed = True
            blocks = list(self._blocks.values())
            self._blocks.clear()
            self._free.clear()
        for block in blocks:
            block.close()
