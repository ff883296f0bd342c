"""MaxText's two spellings of a mixture of training files, read and checked.

* ``grain_train_files: "a*.array_record,0.3;b*.array_record,0.7"``: patterns and weights
  in one string (:func:`mixture_parts`). The components are numbered, so a state
  restores into the same components only.
* ``grain_train_mixture_config_path: mix.json``: named components in a JSON file
  (:func:`load_mixture_config`)::

      {"web":   {"path": "gs://bucket/web-*.array_record",   "weight": 0.7},
       "books": {"path": "gs://bucket/books-*.array_record", "weight": 0.3}}

  MaxText mixes them with ``IterDataset.mix`` of a dict, whose state keeps each
  component's position under its name: a state restores into a mixture with other
  weights, or with components added (they start from their beginning) or removed
  (their positions are dropped). granary does the same.

Example:
    >>> mixture_parts("a*.ar,0.3;b*.ar,0.7")
    [('a*.ar', 0.3), ('b*.ar', 0.7)]
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, NamedTuple

from dataloader.config import checks as check
from dataloader.dataset.compile.mixing import parse_mixture_spec

KEY = "grain_train_mixture_config_path"


class Component(NamedTuple):
    """One named part of a mixture: its file pattern and its weight (not normalised)."""

    name: str
    path: str
    weight: float


def mixture_parts(spec: str) -> list[tuple[str, float]]:
    """``grain_train_files`` as (pattern, weight) parts: one pattern (weight 1), or
    MaxText's ``"a*,0.3;b*,0.7"`` (``:`` also separates a weight, as in ``mix_from_spec``)."""
    if ";" not in spec:
        return [(spec, 1.0)]
    parts = []
    for part in spec.split(";"):
        pattern, comma, weight = part.strip().rpartition(",")
        parts.append(f"{pattern}:{weight}" if comma and pattern else part.strip())
    return parse_mixture_spec(";".join(parts))


def _component(path: str, name: str, entry: Any) -> Component:
    where, it = f"{KEY}: {path!r}", f"component {name!r}"
    if not isinstance(entry, dict):
        raise check.fail(where, f'{it}: expected an object {{"path": ..., "weight": ...}}, got {entry!r}')
    if "path" not in entry:
        raise check.fail(where, f'{it} has no "path" (it has {sorted(entry)}); give the file pattern to read')
    pattern = entry["path"]
    if not isinstance(pattern, str) or not pattern:
        raise check.fail(where, f'{it} "path" must be a non-empty file pattern, got {pattern!r}')
    if "weight" not in entry:
        raise check.fail(where, f'{it} has no "weight" (it has {sorted(entry)}); MaxText requires one')
    weight = entry["weight"]
    try:
        value = float(weight)  # MaxText reads float(weight): "0.5" is a weight too
    except (TypeError, ValueError):
        value = math.nan
    if isinstance(weight, bool) or not math.isfinite(value) or value <= 0:
        raise check.fail(where, f'{it} "weight" must be a number > 0, got {weight!r}; leave the '
                                f"component out of the file rather than giving it weight 0")
    return Component(name, os.path.expanduser(pattern), value)


def load_mixture_config(path: str) -> tuple[Component, ...]:
    """The components of a mixture JSON file (see the module docstring), sorted by name.

    Raises:
        ConfigError: naming the file and what is wrong: it does not exist or is not
            JSON, it is not an object of components, or a component has no ``path``
            or no ``weight`` > 0.
    """
    path = os.path.expanduser(path)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise check.fail(KEY, f"the mixture file {path!r} does not exist; give the path of a JSON "
                              f'file {{name: {{"path": ..., "weight": ...}}}}') from None
    except (OSError, UnicodeDecodeError) as error:
        raise check.fail(KEY, f"cannot read the mixture file {path!r}: {error}") from None
    except json.JSONDecodeError as error:
        raise check.fail(KEY, f"the mixture file {path!r} is not valid JSON: {error}") from None
    if not isinstance(data, dict) or not data:
        raise check.fail(KEY, f'the mixture file {path!r} must hold an object {{name: {{"path": ..., '
                              f'"weight": ...}}}} with at least one component, got {data!r}'[:400])
    return tuple(_component(path, name, data[name]) for name in sorted(data))
