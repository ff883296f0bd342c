"""A local sparse file per remote file, and one byte budget for all of them.

The file has the remote file's size; the bytes fetched so far (its head, its index at
the end, and the chunks read) sit at their own offsets and the rest is a hole, which
takes no disk space. array_record's reader opens it as if it were the whole file: it
reads only the head and the index at open, and then only the chunks of the records
asked for, which are there. A chunk read from a hole fails array_record's hash check
(so a bug here can never yield a wrong record, only an error).

Chunks are evicted least recently used first when the budget would be exceeded, by
punching a hole where they were (``fallocate(PUNCH_HOLE)``, so the disk space is
returned); chunks that a read in flight needs are pinned and never evicted. Each
process has its own files (named by process id): evicting never pulls a chunk from
under another process's reader.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import ctypes.util
import io
import os
import threading
import warnings
import weakref
from collections.abc import Iterator

from ..files.handles import OPEN_FILES

_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02
_libc: ctypes.CDLL | None = None
_no_libc = False


def _punch(fd: int, offset: int, length: int) -> bool:
    """Frees ``[offset, offset + length)`` of ``fd``; False where the system cannot."""
    global _libc, _no_libc
    if _libc is None and not _no_libc:
        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        except OSError:
            _no_libc = True
    if _libc is None or not hasattr(_libc, "fallocate"):
        return False
    mode = _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE
    result = _libc.fallocate(fd, mode, ctypes.c_longlong(offset), ctypes.c_longlong(length))
    return result == 0


def _remove(key: tuple[str, str], path: str) -> None:
    OPEN_FILES.close([key])
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _open_read_write(key: tuple[str, str]) -> io.FileIO:
    return io.FileIO(key[1], "r+")


class Budget:
    """Bytes of chunks held across the sparse files of one process, least recent first."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._order: collections.OrderedDict[tuple[SparseFile, int], int] = collections.OrderedDict()
        self._pins: collections.Counter[tuple[SparseFile, int]] = collections.Counter()
        self.lock = threading.RLock()
        self.evicted = 0

    def add(self, file: SparseFile, chunk: int, size: int) -> None:
        key = (file, chunk)
        if key not in self._order:
            self.used += size
        self._order[key] = size
        self._order.move_to_end(key)

    def touch(self, file: SparseFile, chunk: int) -> None:
        key = (file, chunk)
        if key in self._order:
            self._order.move_to_end(key)

    def pin(self, keys: list[tuple[SparseFile, int]]) -> None:
        self._pins.update(keys)

    def unpin(self, keys: list[tuple[SparseFile, int]]) -> None:
        with self.lock:
            self._pins.subtract(keys)
            for key in keys:
                if self._pins[key] <= 0:
                    del self._pins[key]

    def make_room(self) -> None:
        """Evicts unpinned chunks, least recently used first, until within the limit."""
        if self.used <= self.limit:
            return
        for key in list(self._order):
            if self.used <= self.limit:
                break
            if key in self._pins:
                continue
            size = self._order.pop(key)
            key[0].drop(key[1])
            self.used -= size
            self.evicted += 1

    def forget(self, file: SparseFile) -> None:
        """Drops every chunk of ``file`` from the accounts (the file is being deleted)."""
        for key in [k for k in self._order if k[0] is file]:
            self.used -= self._order.pop(key)


class SparseFile:
    """The local stand-in for one remote file: its size, and the chunks present."""

    def __init__(self, path: str, size: int, offsets: list[int] | None = None) -> None:
        self.path = path
        self.offsets = offsets or []
        self.present = bytearray(max(len(self.offsets) - 1, 0))
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, size)
        finally:
            os.close(fd)
        # Its descriptor is opened when written to, in the process's bounded cache of
        # open files: a mixture of thousands of remote files holds few descriptors.
        self._key = ("sparse", path)
        self._warned = False
        # A process that ends without close() (killed worker aside) still removes it.
        self._finalizer = weakref.finalize(self, _remove, self._key, path)

    @contextlib.contextmanager
    def _fd(self) -> Iterator[int]:
        with OPEN_FILES.hold([self._key], _open_read_write) as (file,):
            yield file.fileno()

    def write(self, offset: int, data: bytes) -> None:
        view = memoryview(data)
        with self._fd() as fd:
            while view:
                written = os.pwrite(fd, view, offset)
                view = view[written:]
                offset += written

    def drop(self, chunk: int) -> None:
        """Returns chunk ``chunk``'s disk space (a hole again) and marks it absent."""
        self.present[chunk] = 0
        start, end = self.offsets[chunk], self.offsets[chunk + 1]
        with self._fd() as fd:
            punched = _punch(fd, start, end - start)
        if not punched:
            # Without hole punching zeros keep the space but still make the chunk unreadable.
            if not self._warned:
                warnings.warn(
                    f"the file system of {self.path!r} cannot punch holes: evicted chunks "
                    "keep their disk space; put cache_dir on ext4, xfs or tmpfs",
                    RuntimeWarning,
                    stacklevel=2,
                )
                self._warned = True
            self.write(start, bytes(end - start))

    def allocated(self) -> int:
        """Bytes of disk the file takes (holes are free)."""
        return os.stat(self.path).st_blocks * 512

    def close(self) -> None:
        self._finalizer()

    def __hash__(self) -> int:
        return id(self)

    def __eq__(self, other: object) -> bool:
        return self is other
