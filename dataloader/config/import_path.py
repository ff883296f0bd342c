"""Turning an import path from a config (``"package.module.name"``) into the object.

Two spellings are accepted, as in Python's entry points and in MaxText/Grain configs:
``"package.module:attribute.inner"`` (explicit split) and ``"package.module.attribute"``
(the longest importable module prefix is taken as the module).

Example:
    >>> resolve_import("os.path:join") is resolve_import("os.path.join")
    True
"""

from __future__ import annotations

import importlib
from typing import Any


class ImportPathError(ValueError):
    """An import path does not name an importable object; the message says why."""


def _walk(obj: Any, module_name: str, attributes: list[str], path: str) -> Any:
    owner = module_name
    for attribute in attributes:
        try:
            obj = getattr(obj, attribute)
        except AttributeError:
            raise ImportPathError(
                f"cannot import {path!r}: {owner!r} has no attribute {attribute!r}"
            ) from None
        owner = f"{owner}.{attribute}"
    return obj


def resolve_import(path: str) -> Any:
    """Returns the object ``path`` names.

    Raises:
        ImportPathError: ``path`` is not a string of dotted names, its module cannot be
            imported, or the attribute does not exist.
    """
    if not isinstance(path, str) or not path.strip():
        raise ImportPathError(f"expected an import path such as 'package.module.function', got {path!r}")
    module_name, colon, attribute = path.partition(":")
    if colon:
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            raise ImportPathError(f"cannot import {path!r}: {error}") from None
        return _walk(module, module_name, attribute.split("."), path)
    parts = path.split(".")
    if not all(part.isidentifier() for part in parts):
        raise ImportPathError(f"{path!r} is not an import path (dotted Python names, e.g. 'pkg.mod.fn')")
    missing: ImportError | None = None
    for cut in range(len(parts), 0, -1):
        name = ".".join(parts[:cut])
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as error:
            # Only "this very module (or its package) is missing" means: try a shorter
            # prefix. A module that exists but fails importing another one is an error.
            gone = error.name or ""
            if not (name == gone or name.startswith(gone + ".")):
                raise ImportPathError(f"cannot import {path!r}: {error}") from None
            missing = missing or error
            continue
        except ImportError as error:
            raise ImportPathError(f"cannot import {path!r}: {error}") from None
        return _walk(module, name, parts[cut:], path)
    raise ImportPathError(f"cannot import {path!r}: {missing}")
