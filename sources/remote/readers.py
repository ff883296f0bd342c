"""The array_record readers open over sparse files in this process, at most a few.

A reader keeps its file's record offsets in memory and a descriptor open, so a mixture
of thousands of remote files would otherwise hold thousands of them for ever. Readers
are opened on first use and the least recently used is closed when more than ``cap``
are open, across every source of the process (like the cache budget). A reader in use
(between :meth:`OpenReaders.acquire` and :meth:`OpenReaders.release`) is never closed;
the cap may be exceeded while more than ``cap`` are in use at once. A closed reader
costs only a local reopen: its sparse file, and the chunks in it, stay.

One lock guards every reader's opening, closing and use count: opening reads the local
sparse file's head and index only, and a read itself holds no lock.
"""

from __future__ import annotations

import collections
import threading
import weakref
from typing import Any, Protocol


class Owner(Protocol):
    """What holds readers: a list of them by file, and how to open one."""

    _readers: list[Any]

    def _open_file_reader(self, f: int) -> Any: ...


class OpenReaders:
    """The readers open in this process, least recently used first (see module)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.cap = 0  # the cap of the latest acquire (sources may ask for different ones)
        self._order: collections.OrderedDict[tuple[int, int], weakref.ref[Any]] = collections.OrderedDict()
        self._users: collections.Counter[tuple[int, int]] = collections.Counter()
        self.closed = 0  # readers closed to stay under the cap

    def __len__(self) -> int:
        return len(self._order)

    def acquire(self, owner: Owner, f: int, cap: int) -> Any:
        """``owner``'s reader of file ``f`` (opened if need be), in use until released."""
        key = (id(owner), f)
        with self.lock:
            reader = owner._readers[f]
            if reader is None:
                reader = owner._readers[f] = owner._open_file_reader(f)
            self._order[key] = weakref.ref(owner)
            self._order.move_to_end(key)
            self._users[key] += 1
            self.cap = cap
            self._close_over_cap()
            return reader

    def release(self, owner: Owner, f: int) -> None:
        key = (id(owner), f)
        with self.lock:
            self._users[key] -= 1
            if self._users[key] <= 0:
                del self._users[key]
            self._close_over_cap()

    def forget(self, owner: Owner) -> None:
        """Closes all of ``owner``'s readers (it is closing)."""
        with self.lock:
            for f, reader in enumerate(owner._readers):
                self._order.pop((id(owner), f), None)
                self._users.pop((id(owner), f), None)
                if reader is not None:
                    owner._readers[f] = None
                    reader.close()

    def _close_over_cap(self) -> None:
        if len(self._order) <= self.cap:
            return
        for key in [k for k in self._order if k not in self._users]:
            if len(self._order) <= self.cap:
                break
            owner = self._order.pop(key)()
            if owner is not None and owner._readers[key[1]] is not None:
                reader, owner._readers[key[1]] = owner._readers[key[1]], None
                reader.close()
                self.closed += 1


OPEN_READERS = OpenReaders()
"""The one registry of this process (a worker process has its own)."""
