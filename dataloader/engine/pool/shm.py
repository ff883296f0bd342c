"""Shared-memory transport: named blocks, a reusable pool of them, and zero-copy pickling.

A worker writes a unit's result into a block the parent lent it: the in-band pickle
(protocol 5) first, then each out-of-band buffer (numpy payloads) at a 64-byte aligned
offset. Only a few dozen bytes of layout travel through the pipe. The parent rebuilds
the result with ``pickle.loads(..., buffers=...)`` over views of the block, so arrays
are not copied; the block goes back to the pool when the last of those arrays is freed
(a ``weakref.finalize`` on the base view).

Blocks are files in ``/dev/shm`` named ``granary_<parent pid>_<token>_<n>``: the parent
owns and unlinks them on every exit path, workers unlink the parent's blocks if the
parent dies (they know its pid), and a new pool sweeps blocks of dead parents. Space
is reserved with ``posix_fallocate`` so a full ``/dev/shm`` is an error at allocation
(handled by falling back to the pipe) instead of a ``SIGBUS`` in a worker.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import pickle
import threading
import time
import weakref
from typing import Any

import numpy as np

from dataloader.sources.shared_memory import ALIGN, PREFIX, SHM_DIR, create_block
from dataloader.sources.shared_memory import pid_alive as _pid_alive
from dataloader.sources.shared_memory import round_up as _round_up


def shm_available() -> bool:
    return os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)


def shm_free_bytes() -> int:
    """Bytes that can still be allocated in ``/dev/shm``."""
    st = os.statvfs(SHM_DIR)
    return st.f_bavail * st.f_frsize


def unlink_if_orphaned(head: str, owner_pid: int, wait_s: float = 0.0) -> int:
    """Unlinks the blocks named ``head...`` if their owner ``owner_pid`` (the training
    process) is gone: a worker or fork server cleaning up after it. While the owner
    runs, its blocks are its own business (a worker that stops may not take them).

    ``wait_s``: how long to wait for the owner to be gone, for a caller that knows it is
    dying. A killed process closes its descriptors before it becomes a zombie, so the
    end of a pipe or socket can be seen while it still looks alive.
    """
    deadline = time.monotonic() + wait_s
    while _pid_alive(owner_pid):
        if time.monotonic() >= deadline:
            return 0
        time.sleep(0.01)
    return unlink_prefixed(head)


def unlink_blocks_of(pid: int) -> int:
    """Unlinks every block made by process ``pid``; returns how many."""
    return unlink_prefixed(f"{PREFIX}{pid}_")


def unlink_prefixed(head: str) -> int:
    """Unlinks every block whose name starts with ``head``; returns how many."""
    count = 0
    with contextlib.suppress(OSError):
        for name in os.listdir(SHM_DIR):
            if name.startswith(head):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(SHM_DIR, name))
                    count += 1
    return count


def sweep_stale_blocks() -> int:
    """Unlinks blocks left by processes that no longer exist (e.g. a SIGKILLed group)."""
    count = 0
    with contextlib.suppress(OSError):
        for name in os.listdir(SHM_DIR):
            if not name.startswith(PREFIX):
                continue
            pid = name[len(PREFIX) :].split("_", 1)[0]
            if pid.isdigit() and not _pid_alive(int(pid)):
                count += unlink_blocks_of(int(pid))
    return count


class Block:
    """A named shared-memory block created (and owned) by this process."""

    def __init__(self, name: str, size: int) -> None:
        self.name = name
        self.size = size
        self.mmap = create_block(name, size)

    def unlink(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(SHM_DIR, self.name))

    def close(self) -> None:
        # Arrays the user still holds keep the mapping alive; it closes when they go.
        with contextlib.suppress(BufferError):
            self.mmap.close()


def attach(name: str) -> mmap.mmap:
    """Maps a block made by another process (the worker side)."""
    fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR)
    try:
        return mmap.mmap(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)


def dumps(obj: Any) -> tuple[bytes, list[memoryview]]:
    """Pickles with protocol 5; large contiguous buffers come back out of band."""
    buffers: list[pickle.PickleBuffer] = []
    header = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    return header, [b.raw() for b in buffers]


def payload_size(header: bytes, buffers: list[memoryview]) -> int:
    size = _round_up(len(header), ALIGN)
    for b in buffers:
        size += _round_up(b.nbytes, ALIGN)
    return size


def write_payload(target: mmap.mmap, header: bytes, buffers: list[memoryview]) -> list[tuple[int, int]]:
    """Writes header and buffers into ``target``; returns the layout ``[(offset, length)]``."""
    layout = [(0, len(header))]
    target[0 : len(header)] = header
    offset = _round_up(len(header), ALIGN)
    for b in buffers:
        n = b.nbytes
        target[offset : offset + n] = b
        layout.append((offset, n))
        offset = _round_up(offset + n, ALIGN)
    return layout


def read_payload(base: np.ndarray, layout: list[tuple[int, int]]) -> Any:
    """Rebuilds an object written by :func:`write_payload`, viewing ``base`` without copies."""
    (h_off, h_len), rest = layout[0], layout[1:]
    header = base[h_off : h_off + h_len].tobytes()
    return pickle.loads(header, buffers=[base[o : o + n] for o, n in rest])


class BlockPool:
    """Blocks lent to workers for results, reused instead of created per unit.

    A block is *free*, *lent* (a worker writes into it) or *leased* (arrays the user
    holds view it). ``lease`` returns a base view whose garbage collection frees the
    block. All blocks are unlinked by ``close``. Thread-safe: finalizers run wherever
    the garbage collector does.
    """

    def __init__(self) -> None:
        self.prefix = f"{PREFIX}{os.getpid()}_{os.urandom(4).hex()}_"
        self._lock = threading.Lock()
        self._free: list[Block] = []
        self._blocks: dict[str, Block] = {}
        self._count = 0
        self.discarded: list[str] = []  # names workers should unmap
        self.target_size = 0
        self.closed = False

    @property
    def names(self) -> list[str]:
        return list(self._blocks)

    def note_payload(self, nbytes: int) -> None:
        """Grows the size of new blocks so results of ``nbytes`` fit, with headroom."""
        if nbytes > self.target_size:
            self.target_size = _round_up(int(nbytes * 1.25) + ALIGN, 1 << 16)

    def acquire(self) -> Block | None:
        """A free block of the target size, a new one, or ``None`` (use the pipe).

        Raises:
            OSError: a new block could not be made (``/dev/shm`` is full).
        """
        with self._lock:
            if self.closed or not self.target_size:
                return None
            while self._free:
                block = self._free.pop()
                if block.size >= self.target_size:
                    return block
                self._discard(block)
            name = f"{self.prefix}{self._count}"
            self._count += 1
        block = Block(name, self.target_size)
        with self._lock:
            self._blocks[name] = block
        return block

    def give_back(self, block: Block) -> None:
        with self._lock:
            if self.closed or block.name not in self._blocks:
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
        self._blocks.pop(block.name, None)
        self.discarded.append(block.name)
        block.unlink()
        block.close()

    def close(self) -> None:
        with self._lock:
            self.closed = True
            blocks = list(self._blocks.values())
            self._blocks.clear()
            self._free.clear()
        for block in blocks:
            block.unlink()
            block.close()
