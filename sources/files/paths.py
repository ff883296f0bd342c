"""What file-backed sources share: their paths, and their per-process file handles.

Paths. ``paths`` is one path (``str`` or ``os.PathLike``), one glob pattern, or a list
(or tuple) of those. The files matched by a glob are sorted so that the record
order never depends on the file system's directory order; the order of the
list itself is kept, so a caller decides how files are concatenated.

An existing path is taken literally even if it contains glob characters, so a
file really named ``data[1].parquet`` can be read.

A URL (``s3://bucket/train-*.parquet``, any fsspec URL) is listed through its store
(:func:`.remote.urls.expand_urls`): a glob is one listing, its matches sorted.

Handles are opened lazily, in the process that reads, through the process's one bounded
cache of open files (:mod:`.handles`); they are never pickled or shared across a fork.
"""

from __future__ import annotations

import glob
import os
import re
import threading
import weakref
from collections.abc import Hashable, Iterable, Sequence
from typing import Any

from .handles import OPEN_FILES, adopt_limit
from .metadata_index import INDEX_NAME

PathArg = str | os.PathLike | Sequence[str | os.PathLike]

_GLOB_CHARS = frozenset("*?[")
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")


def expand_paths(paths: PathArg, *, what: str, example_glob: str) -> list[str]:
    """Expands ``paths`` into a non-empty list of existing regular files.

    Args:
        paths: A path, a glob pattern, or a list of those.
        what: What the files hold, for messages (e.g. ``"ArrayRecord"``).
        example_glob: A file-name pattern to suggest in messages (``"*.parquet"``).

    Returns:
        The files as strings, globs expanded and sorted in place in the list.

    Raises:
        TypeError: ``paths`` or an element of it is not a path.
        ValueError: The list is empty, or a path is a directory.
        FileNotFoundError: A path does not exist or a glob matches nothing.
    """
    if isinstance(paths, str | os.PathLike):
        items = [paths]
    elif isinstance(paths, list | tuple):
        items = list(paths)
        if not items:
            raise ValueError(
                f"paths is an empty {type(paths).__name__}; pass at least one {what} "
                f"file or a glob such as {os.path.join('data', example_glob)!r}"
            )
    else:
        raise TypeError(
            f"paths must be a path, a glob pattern or a list of those, got "
            f"{type(paths).__name__} {paths!r}"
        )
    files: list[str] = []
    for item in items:
        if not isinstance(item, str | os.PathLike):
            raise TypeError(
                f"each path must be a str or os.PathLike, got {type(item).__name__} "
                f"{item!r} in paths"
            )
        path = os.fspath(item)
        if _URL.match(path):
            from ..remote.urls import expand_urls

            files.extend(url for url, _ in expand_urls([path], what=what, example_glob=example_glob))
        else:
            files.extend(_expand_one(path, what, example_glob))
    return files


def _expand_one(path: str, what: str, example_glob: str) -> list[str]:
    if os.path.exists(path):
        matches = [path]
    elif _GLOB_CHARS.intersection(path):
        matches = sorted(glob.glob(path, recursive=True))
        if not matches:
            raise FileNotFoundError(
                f"glob pattern {path!r} matches no file; check the directory and the "
                f"file extension of your {what} files"
            )
    else:
        raise FileNotFoundError(f"{what} file {path!r} does not exist")
    matches = [m for m in matches if os.path.basename(m) != INDEX_NAME or m == path]
    if not matches:
        raise FileNotFoundError(f"glob pattern {path!r} matches only the metadata index {INDEX_NAME}")
    for match in matches:
        if os.path.isdir(match):
            raise ValueError(
                f"{match!r} is a directory, expected {_article(what)} {what} file; pass a glob such "
                f"as {os.path.join(match, example_glob)!r}"
            )
    return matches


def _article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"


def format_paths(paths: Sequence[str]) -> str:
    """Formats ``paths`` for a repr: all of them when few, else the ends."""
    quoted = [repr(path) for path in paths]
    if len(quoted) > 4:
        quoted = [*quoted[:2], f"... {len(quoted) - 3} more ...", quoted[-1]]
    return f"[{', '.join(quoted)}]"


class PerProcessHandles:
    """Mixin for sources that read files.

    Open files live in the process's shared cache (:data:`.handles.OPEN_FILES`, bounded
    whatever the number of sources) under keys that :meth:`_file_keys` lists, so a
    source itself holds none. What else belongs to one process (decoded row groups, a
    fetcher) is listed in ``_TRANSIENT`` and rebuilt (closed) in ``_reset_handles``;
    ``_close_handles`` closes it. Both are dropped when the source is pickled and rebuilt
    in a new process, so a source travels to workers as its paths and metadata alone,
    with the limit on open files of the process that pickled it.
    """

    _TRANSIENT: tuple[str, ...] = ()

    def _file_keys(self) -> Iterable[Hashable]:
        """The keys of this source's files in the shared cache (closed by ``close``)."""
        return ()

    def _reset_handles(self) -> None:
        """Rebuilds the per-process state of ``_TRANSIENT`` (none by default)."""

    def _close_handles(self) -> None:
        """Closes the per-process state of ``_TRANSIENT`` (none by default)."""

    def _init_process_state(self) -> None:
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._reset_handles()
        # A source that is gone leaves no file open (another source of the same file
        # reopens it if it reads on).
        self._closer = weakref.finalize(self, OPEN_FILES.close, tuple(self._file_keys()))

    def _ensure_own_process(self) -> None:
        if self._pid != os.getpid():
            # A forked child must not share the parent's handles (or its lock, which
            # another thread may have held at the fork).
            self._init_process_state()

    def close(self) -> None:
        """Closes the open files; a later read opens them again."""
        OPEN_FILES.close(self._file_keys())
        with self._lock:
            self._close_handles()
            self._reset_handles()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in (*self._TRANSIENT, "_lock", "_pid", "_closer"):
            state.pop(name, None)
        state["_open_file_limit"] = OPEN_FILES.limit
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        adopt_limit(state.pop("_open_file_limit", None))
        self.__dict__.update(state)
        self._init_process_state()
