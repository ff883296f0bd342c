"""A pipeline config's source section: what to read, checked when the config is loaded.

The ``source:`` section, and each source of a ``mixture:`` (:mod:`.mixture`), is::

    kind: array_record                 # array_record | parquet | an import path
    paths: data/train-*.array_record   # a path, a glob or a list (from the cwd)
    options: {}                        # keyword arguments of the source

:func:`parse_source` checks it without opening a data file: the kind imports and is
callable, the options bind to its signature, each path (or glob) names files.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from collections.abc import Mapping
from typing import Any

from dataloader.config import checks as check
from dataloader.config.import_path import ImportPathError, resolve_import
from dataloader.sources import expand_paths

SOURCE_KINDS = {"array_record": "dataloader.sources.ArrayRecordDataSource", "parquet": "dataloader.sources.ParquetDataSource"}
# What a built-in kind's files are called in messages, and a glob to suggest.
_SOURCE_FILES = {"array_record": ("ArrayRecord", "*.array_record"), "parquet": ("Parquet", "*.parquet")}
SOURCE_KEYS = ("kind", "paths", "options")


@dataclasses.dataclass(frozen=True)
class SourceConfig:
    """``source:``: what to read. ``factory(paths, **options)`` builds it."""

    kind: str
    paths: tuple[str, ...] | None
    options: Mapping[str, Any]
    factory: Any = dataclasses.field(repr=False, compare=False)

    def build(self) -> Any:
        if self.paths is None:
            return self.factory(**self.options)
        return self.factory(list(self.paths), **self.options)


def _check_paths(where: str, kind: str, paths: tuple[str, ...]) -> tuple[str, ...]:
    """Checks each path as the source will expand it; returns them with ``~`` expanded.

    A built-in kind's files go through the sources' own :func:`~sources.expand_paths`
    (globs recursive, directories refused); another kind's factory may take a directory.
    """
    what, example_glob = _SOURCE_FILES.get(kind, ("source", "*"))
    expanded = tuple(os.path.expanduser(path) for path in paths)
    for i, path in enumerate(expanded):
        at = check.sub(where, i) if len(paths) > 1 else where
        try:
            expand_paths(path, what=what, example_glob=example_glob)
        except FileNotFoundError as error:
            raise check.fail(at, f"{error} (relative paths are read from {os.getcwd()})") from None
        except ValueError as error:  # a directory
            if kind in _SOURCE_FILES:
                raise check.fail(at, str(error)) from None
    return expanded


def parse_source(where: str, section: Mapping[str, Any], check_files: bool = True) -> SourceConfig:
    """Checks one source section (a mapping of :data:`SOURCE_KEYS`) found at ``where``.

    Raises:
        ConfigError: naming the key (``source.kind``, ``mixture.sources.web.paths``, ...).
    """
    check.known_keys(where, section, SOURCE_KEYS)
    kind = check.string(check.sub(where, "kind"), check.get(section, "kind", where=where))
    paths = section.get("paths")
    options = check.mapping(check.sub(where, "options"), section.get("options"))
    if kind in SOURCE_KINDS and paths is None:
        raise check.fail(check.sub(where, "paths"), f"missing; a {kind} source needs paths (a path, glob or list)")
    if paths is not None:
        paths = check.strings(check.sub(where, "paths"), paths)
        if check_files:
            paths = _check_paths(check.sub(where, "paths"), kind, paths)
    try:
        factory = resolve_import(SOURCE_KINDS.get(kind, kind))
    except ImportPathError as error:
        raise check.fail(
            check.sub(where, "kind"), f"not one of {', '.join(SOURCE_KINDS)} and not an import path: {error}"
        ) from None
    if not callable(factory):
        raise check.fail(check.sub(where, "kind"), f"{kind} is a {type(factory).__name__}, not callable")
    try:
        inspect.signature(factory).bind(*([paths] if paths is not None else []), **options)
    except TypeError as error:
        raise check.fail(check.sub(where, "options"), f"{kind} does not take these options: {error}") from None
    except ValueError:  # no signature to check; the call itself will tell
        pass
    return SourceConfig(kind, paths, options, factory)
