"""Command-line overrides of a nested config: ``key.sub=value``, as MaxText writes them.

The key is a dotted path into the config; a segment that is an integer indexes a list
(``operations.1.args.scale=2``). The value is read as YAML, so ``3`` is an integer,
``true`` a boolean, ``null`` None, ``[a, b]`` a list and anything else a string; an
empty value is the empty string. Missing mappings on the way are created, so an
override can add a key the file does not have (the config's schema then decides
whether the key exists at all).

Example:
    >>> apply_overrides({"sampler": {"seed": 1}}, ["sampler.seed=7", "loader.worker_count=2"])
    {'sampler': {'seed': 7}, 'loader': {'worker_count': 2}}
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

import yaml

from dataloader.errors import ConfigError


class OverrideError(ConfigError):
    """An override is malformed or does not fit the config's structure (a config error)."""


def parse_override(text: str) -> tuple[list[str], Any]:
    """Splits ``"a.b.c=value"`` into ``(["a", "b", "c"], parsed value)``."""
    key, equals, value_text = text.partition("=")
    if not equals or not key.strip():
        raise OverrideError(f"override {text!r} is not of the form key.sub=value, e.g. sampler.seed=7")
    parts = key.strip().split(".")
    if not all(parts):
        raise OverrideError(f"override {text!r} has an empty part in its key {key!r}")
    if not value_text.strip():
        return parts, ""
    try:
        value = yaml.safe_load(value_text)
    except yaml.YAMLError as error:
        problem = str(error).splitlines()[0]
        raise OverrideError(f"override {text!r}: the value is not valid YAML ({problem})") from None
    return parts, value


def _set(config: dict[str, Any], parts: list[str], value: Any, text: str) -> None:
    node: Any = config
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        where = ".".join(parts[: depth + 1])
        if isinstance(node, list):
            if not part.lstrip("-").isdigit() or not -len(node) <= int(part) < len(node):
                raise OverrideError(
                    f"override {text!r}: {where} is not an index of the list "
                    f"{'.'.join(parts[:depth]) or 'config'} (it has {len(node)} items)"
                )
            index = int(part)
            if last:
                node[index] = value
            else:
                node = node[index]
        elif isinstance(node, dict):
            # a mapping keyed by integers (a schedule's points) is written with digits
            key: Any = int(part) if part not in node and part.lstrip("-").isdigit() and int(part) in node else part
            if last:
                node[key] = value
            else:
                node = node.setdefault(key, {})
        else:
            parent = ".".join(parts[:depth])
            raise OverrideError(
                f"override {text!r}: {parent} is {node!r}, not a mapping or a list, so it "
                f"has no {part!r}"
            )


def apply_overrides(config: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Returns a copy of ``config`` with each ``key.sub=value`` override applied in order."""
    if isinstance(overrides, str):
        overrides = [overrides]
    result = copy.deepcopy(config)
    for text in overrides:
        if not isinstance(text, str):
            raise OverrideError(f"overrides must be strings key.sub=value, got {text!r}")
        parts, value = parse_override(text)
        _set(result, parts, value, text)
    return result
