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

  granary also reads a **weight schedule** there: a component's ``"weight"`` may be a
  list of ``[at, weight]`` points (the first at 0, ``at`` increasing), where ``at``
  counts the documents this host's mixture has drawn (before packing: a training step's
  rows hold a varying number of documents, so steps are not a count the mixture
  knows). Each weight holds until the component's next point (a weight of 0 leaves the
  component out meanwhile); :func:`mixture_weights` turns the file into one
  :class:`~dataloader.WeightSchedule`::

      {"web":   {"path": "web-*.array_record",   "weight": [[0, 0.9], [100000, 0.6]]},
       "books": {"path": "books-*.array_record", "weight": [[0, 0.1], [100000, 0.4]]}}

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
from dataloader.dataset.compile.schedule import WeightSchedule

KEY = "grain_train_mixture_config_path"


class Component(NamedTuple):
    """One named part of a mixture: its file pattern and its weight (not normalised), or
    its weight schedule: ``((at, weight), ...)`` from ``at`` 0."""

    name: str
    path: str
    weight: float | tuple[tuple[int, float], ...]


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
    if isinstance(weight, list):
        return Component(name, os.path.expanduser(pattern), _points(where, it, weight))
    value = _number(weight)
    if not value > 0:
        raise check.fail(where, f'{it} "weight" must be a number > 0, got {weight!r}; leave the '
                                f"component out of the file rather than giving it weight 0")
    return Component(name, os.path.expanduser(pattern), value)


def _number(weight: Any) -> float:
    """``float(weight)`` as MaxText reads it (``"0.5"`` is a weight too); NaN if it is none."""
    try:
        value = float(weight)
    except (TypeError, ValueError):
        return math.nan
    return value if not isinstance(weight, bool) and math.isfinite(value) else math.nan


def _points(where: str, it: str, points: list[Any]) -> tuple[tuple[int, float], ...]:
    """A component's ``[[at, weight], ...]`` schedule, checked."""
    out: list[tuple[int, float]] = []
    for i, point in enumerate(points):
        ok = isinstance(point, list) and len(point) == 2 and isinstance(point[0], int) \
            and not isinstance(point[0], bool) and point[0] >= 0 and _number(point[1]) >= 0
        if not ok:
            raise check.fail(where, f'{it} "weight" point {i} must be [at, weight] with at an integer >= 0 '
                                    f"and weight a number >= 0, got {point!r}")
        if (i == 0 and point[0] != 0) or (i and point[0] <= out[-1][0]):
            raise check.fail(where, f'{it} "weight" points must start at 0 and increase, got {points!r}'[:300])
        out.append((point[0], _number(point[1])))
    if not out:
        raise check.fail(where, f'{it} "weight" is an empty list; give [[0, weight], ...] or a number')
    return tuple(out)


def mixture_weights(components: tuple[Component, ...]) -> dict[str, float] | WeightSchedule:
    """The components' weights by name, or one ``WeightSchedule`` (weights by name, a point
    wherever a component's weight changes) when a component has a schedule.

    Raises:
        ConfigError: the weights at some point are all 0.
    """
    if all(not isinstance(c.weight, tuple) for c in components):
        return {c.name: float(c.weight) for c in components}  # type: ignore[arg-type]
    steps = {c.name: c.weight if isinstance(c.weight, tuple) else ((0, c.weight),) for c in components}
    ats = sorted({at for points in steps.values() for at, _ in points})
    try:
        return WeightSchedule([(at, {name: _at(points, at) for name, points in steps.items()}) for at in ats])
    except ValueError as error:
        raise check.fail(KEY, f"the weights of the mixture file do not make a schedule: {error}") from None


def _at(points: tuple[tuple[int, float], ...], at: int) -> float:
    return [w for a, w in points if a <= at][-1]


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
    components = tuple(_component(path, name, data[name]) for name in sorted(data))
    mixture_weights(components)  # a schedule's points are checked together here, at the door
    return components
