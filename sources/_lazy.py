"""Per-process file handles, opened lazily and never pickled or shared across a fork."""

from __future__ import annotations

import os
import threading
from typing import Any


class PerProcessHandles:
    """Mixin for sources that hold open files.

    Subclasses list the attributes that belong to one process in ``_TRANSIENT`` and
    rebuild them (closed) in ``_reset_handles``; ``_close_handles`` closes what is open.
    Handles are dropped when the source is pickled and rebuilt in a new process, so a
    source travels to workers as its paths alone.
    """

    _TRANSIENT: tuple[str, ...] = ()

    def _reset_handles(self) -> None:
        raise NotImplementedError

    def _close_handles(self) -> None:
        raise NotImplementedError

    def _init_process_state(self) -> None:
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._reset_handles()

    def _ensure_own_process(self) -> None:
        if self._pid != os.getpid():
            # A forked child must not share the parent's handles (or its lock, which
            # another thread may have held at the fork).
            self._init_process_state()

    def close(self) -> None:
        """Closes the open files; a later read opens them again."""
        with self._lock:
            self._close_handles()
            self._reset_handles()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in (*self._TRANSIENT, "_lock", "_pid"):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_process_state()
