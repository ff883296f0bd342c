"""Turns the ``paths`` argument of a file-backed source into a list of files.

``paths`` is one path (``str`` or ``os.PathLike``), one glob pattern, or a list
(or tuple) of those. The files matched by a glob are sorted so that the record
order never depends on the file system's directory order; the order of the
list itself is kept, so a caller decides how files are concatenated.

An existing path is taken literally even if it contains glob characters, so a
file really named ``data[1].parquet`` can be read.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence

PathArg = str | os.PathLike | Sequence[str | os.PathLike]

_GLOB_CHARS = frozenset("*?[")


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
        files.extend(_expand_one(os.fspath(item), what, example_glob))
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
