"""The files a process holds open, across all its sources, at most a bounded number.

A mixture of a thousand sources would otherwise hold a thousand open readers in every
process (one per file and process, for ever): past the default ``ulimit -n`` of 1,024
the process cannot open a socket or a pipe any more, and every open ArrayRecord reader
also keeps its file's record offsets in memory. So every file-backed source of this
package opens its files through one cache per process, :data:`OPEN_FILES`, which keeps
at most :func:`max_open_files` of them open (128 unless set) and closes the least
recently used beyond that; a closed file is opened again when it is read again.

Keys name what is open: a tuple such as ``("array_record", path, options)``. Two sources
over the same file with the same options share one handle. A handle in use (between
:meth:`OpenFiles.acquire` and :meth:`OpenFiles.release`, or inside :meth:`OpenFiles.hold`)
is never closed under its reader: when more than the limit are in use at once the limit
is exceeded until they are released, and a handle closed while in use (a source's
``close()``) is closed at its release.

The limit is the process's. A source carries the limit of the process that pickled it to
the worker that unpickles it (:func:`adopt_limit`), so ``dl.set_max_open_files(n)`` in the
training process holds in its workers too, unless a worker sets its own. A forked child
starts with an empty cache: it never reads through its parent's handles (it drops them).

What a reopen costs, measured (``python benchmarks/mixtures.py``): about 60 us for an
ArrayRecord file of 200 records (the reader reads its footer and index again), a few us
for TFRecord and JSONL files (an ``open``), a footer parse for Parquet. A mixture that
reads from more files at once than the limit pays it on most reads; raise the limit
when ``ulimit -n`` allows (each open file is one descriptor, plus the reader's memory).

Example:
    >>> class Handle:
    ...     def close(self): print("closed")
    >>> files = OpenFiles(limit=1)
    >>> with files.hold([("demo", "a")], lambda key: Handle()) as (a,):
    ...     pass
    >>> with files.hold([("demo", "b")], lambda key: Handle()) as (b,):
    ...     pass
    closed
    >>> len(files)
    1
"""

from __future__ import annotations

import collections
import contextlib
import io
import os
import threading
from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import Any, Protocol

DEFAULT_MAX_OPEN_FILES = 128
"""Files kept open per process unless :func:`set_max_open_files` says otherwise: with the
few descriptors a worker needs besides (shared memory, pipes), well under the default
``ulimit -n`` of 1,024."""


class Handle(Protocol):
    """An open file, reader or descriptor wrapper: anything with ``close()``."""

    def close(self) -> None: ...


Opener = Callable[[Any], Handle]
"""Opens the handle of a key (called with the key)."""


def check_limit(limit: object, name: str = "max_open_files") -> int:
    """``limit`` if it is an int >= 1, else a ValueError naming it."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(
            f"{name} is {limit!r}; pass the number of files a process may keep open, "
            f"an int >= 1 (the default is {DEFAULT_MAX_OPEN_FILES})"
        )
    return limit


class OpenFiles:
    """Open handles by key, least recently used first, at most ``limit`` kept open.

    Thread-safe: one lock guards the bookkeeping; opening a file happens under it too (so
    two threads never open the same key twice), reading from a handle does not. The lock
    is re-entrant because a source's finalizer calls :meth:`close`, and the garbage
    collector runs finalizers in whatever thread allocates: inside an opener (pyarrow
    allocating while it opens a file) or a handle's ``close()``, with the lock held. The
    bookkeeping is consistent at every point where those can run.

    Attributes:
        opened: handles opened so far (a reopen counts again).
        evicted: handles closed to stay within the limit.
    """

    def __init__(self, limit: int = DEFAULT_MAX_OPEN_FILES) -> None:
        self._limit = check_limit(limit)
        self._chosen = False  # set in this process by set_limit (not adopted)
        self._lock = threading.RLock()
        self._open: collections.OrderedDict[Hashable, Handle] = collections.OrderedDict()
        self._users: collections.Counter[Hashable] = collections.Counter()
        self._doomed: set[Hashable] = set()  # closed by their owner while in use
        self.opened = 0
        self.evicted = 0

    @property
    def limit(self) -> int:
        return self._limit

    def set_limit(self, limit: int) -> None:
        """Keeps at most ``limit`` files open from now on (closing the excess now)."""
        with self._lock:
            self._limit = check_limit(limit)
            self._chosen = True
            self._evict()

    def adopt(self, limit: int) -> None:
        """Takes ``limit`` (a parent process's) unless this process chose its own."""
        with self._lock:
            if not self._chosen and limit != self._limit:
                self._limit = check_limit(limit)
                self._evict()

    def __len__(self) -> int:
        return len(self._open)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._open

    def acquire(self, key: Hashable, opener: Opener) -> Any:
        """The handle of ``key``, opened with ``opener(key)`` if need be, in use until
        :meth:`release`. An error from ``opener`` propagates and leaves nothing held."""
        with self._lock:
            handle = self._open.get(key)
            if handle is None:
                handle = opener(key)
                self.opened += 1
                self._open[key] = handle
                self._users[key] += 1
                self._evict()
            else:
                self._open.move_to_end(key)
                self._users[key] += 1
            return handle

    def release(self, key: Hashable) -> None:
        """Ends one use of ``key``'s handle (from :meth:`acquire`)."""
        with self._lock:
            left = self._users[key] - 1
            if left > 0:
                self._users[key] = left
                return
            del self._users[key]
            if key in self._doomed:
                self._doomed.discard(key)
                self._open.pop(key).close()
            elif len(self._open) > self._limit:
                self._evict()

    @contextlib.contextmanager
    def hold(self, keys: Iterable[Hashable], opener: Opener) -> Iterator[list[Any]]:
        """The handles of ``keys`` (in that order), all in use while the block runs."""
        held: list[Hashable] = []
        try:
            handles = []
            for key in keys:
                handles.append(self.acquire(key, opener))
                held.append(key)
            yield handles
        finally:
            for key in held:
                self.release(key)

    def close(self, keys: Iterable[Hashable]) -> None:
        """Closes the handles of ``keys`` now (those in use: at their release)."""
        with self._lock:
            for key in keys:
                if key not in self._open:
                    continue
                if key in self._users:
                    self._doomed.add(key)
                else:
                    self._open.pop(key).close()

    def _evict(self) -> None:
        """Closes unused handles, least recently used first, down to the limit."""
        while len(self._open) > self._limit:
            for key in self._open:  # oldest first; usually the very first is unused
                if key not in self._users:
                    break
            else:
                return  # all in use: the limit is exceeded until they are released
            self._open.pop(key).close()
            self.evicted += 1

    def _forget_after_fork(self) -> None:
        """In a forked child: the parent's handles are the parent's (its lock too)."""
        self._lock = threading.RLock()
        self._open = collections.OrderedDict()
        self._users = collections.Counter()
        self._doomed = set()


OPEN_FILES = OpenFiles()
"""The one cache of this process (a worker process has its own)."""

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=OPEN_FILES._forget_after_fork)


def set_max_open_files(limit: int) -> None:
    """Keeps at most ``limit`` files open in this process, across all its sources.

    Sources pickled after the call carry the limit to the worker processes that read
    them. The default, :data:`DEFAULT_MAX_OPEN_FILES` (128), suits the default
    ``ulimit -n`` of 1,024; a mixture that reads from more files at once than the limit
    reopens files (see the module docstring for what that costs).

    Raises:
        ValueError: ``limit`` is not an int >= 1.

    Example:
        >>> import dataloader as dl
        >>> dl.set_max_open_files(256)
        >>> dl.max_open_files()
        256
        >>> dl.set_max_open_files(128)
    """
    OPEN_FILES.set_limit(limit)


def max_open_files() -> int:
    """The most files this process keeps open across its sources (see :func:`set_max_open_files`)."""
    return OPEN_FILES.limit


def adopt_limit(limit: int | None) -> None:
    """In a process that unpickled a source: take the limit of the process that pickled it."""
    if limit is not None:
        OPEN_FILES.adopt(limit)


def open_raw(key: tuple[str, str]) -> io.FileIO:
    """Opens the file of a key ``("file", path)`` unbuffered, for ``os.pread`` on its
    ``fileno()`` (one key a path: the TFRecord and JSONL sources share it)."""
    return io.FileIO(key[1], "r")


def read_range(file: io.FileIO, start: int, size: int) -> bytes:
    """``size`` bytes of ``file`` from ``start`` (fewer only where the file ends), by
    ``os.pread``: no shared position, so threads read one file at once."""
    fd, parts, done = file.fileno(), [], 0
    while done < size:  # pread returns less than asked only at the end of the file
        part = os.pread(fd, size - done, start + done)
        if not part:
            break
        parts.append(part)
        done += len(part)
    return parts[0] if len(parts) == 1 else b"".join(parts)
