"""Typed reads from a parsed YAML mapping, each error naming the config key.

Every reader takes ``where``, the dotted key of the value (``"sampler.seed"``,
``"operations.1.args"``: list items by index, as overrides write them), and raises
:class:`ConfigError` with a message of the form
``"sampler.seed: expected an integer (or null), got 'abc'"``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from dataloader.errors import ConfigError

_MISSING: Any = object()


def _shipped_hint(path: str) -> str:
    from dataloader.config.shipped import shipped_configs

    name = os.path.basename(path)
    stem = name[:-5] if name.endswith(".yaml") else name
    if stem in shipped_configs():
        return f"; granary ships a config named {stem!r}: pass {stem!r} to read it from the package"
    return ""


def read_yaml_file(path: str) -> Any:
    """Parses the YAML file at ``path`` (None when the file is empty).

    Raises:
        ConfigError: the file does not exist, or is not valid YAML (the message names
            the path and quotes the parser's complaint).
    """
    try:
        with open(path, encoding="utf-8") as f:
            return yaml.safe_load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path!r} does not exist{_shipped_hint(path)}") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from None


def fail(where: str, message: str) -> ConfigError:
    return ConfigError(f"{where}: {message}")


def sub(where: str, key: str | int) -> str:
    # Lists are indexed with a dot too, so a key in a message is also an override key.
    return f"{where}.{key}" if where else str(key)


def mapping(where: str, value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise fail(where, f"expected a mapping of keys to values, got {value!r}")
    for key in value:
        if not isinstance(key, str):
            raise fail(where, f"keys must be strings, got {key!r}")
    return dict(value)


def known_keys(where: str, value: Mapping[str, Any], allowed: Iterable[str]) -> None:
    allowed = list(allowed)
    for key in value:
        if key not in allowed:
            raise fail(sub(where, key), f"unknown key; expected one of {', '.join(allowed)}")


def integer(where: str, value: Any, *, low: int | None = None, null_ok: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise fail(where, f"expected an integer{' (or null)' if null_ok else ''}, got {value!r}")
    if low is not None and value < low:
        raise fail(where, f"expected an integer >= {low}, got {value!r}")
    return value


def optional_integer(where: str, value: Any, *, low: int | None = None) -> int | None:
    """An integer, or None for a YAML ``null``."""
    return None if value is None else integer(where, value, low=low, null_ok=True)


def boolean(where: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise fail(where, f"expected true or false, got {value!r}")
    return value


def string(where: str, value: Any, *, choices: Iterable[str] | None = None) -> str:
    if not isinstance(value, str) or not value:
        raise fail(where, f"expected a non-empty string, got {value!r}")
    if choices is not None and value not in (choices := list(choices)):
        raise fail(where, f"expected one of {', '.join(choices)}, got {value!r}")
    return value


def strings(where: str, value: Any) -> tuple[str, ...]:
    """A string or a list of strings."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise fail(where, f"expected a string or a non-empty list of strings, got {value!r}")
    return tuple(string(sub(where, i), item) for i, item in enumerate(value))


def get(section: Mapping[str, Any], key: str, default: Any = _MISSING, *, where: str) -> Any:
    if key in section:
        return section[key]
    if default is _MISSING:
        raise fail(sub(where, key), "missing; this key is required")
    return default


def number(where: str, value: Any, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise fail(where, f"expected a number, got {value!r}")
    if positive and not value > 0:
        raise fail(where, f"expected a number > 0, got {value!r}")
    return float(value)
