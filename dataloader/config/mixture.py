"""A pipeline config's ``mixture:`` section: several sources read as one, by weight.

In place of ``source:``, a config may name sources to mix (docs/mixtures-at-scale.md)::

    mixture:
      sources:                       # name: a source section (kind, paths, options)
        web: {kind: array_record, paths: data/web-*.array_record}
        books: {kind: array_record, paths: data/books-*.array_record}
      weights: {web: 0.7, books: 0.3}     # fixed weights by name (none: equal), or
      schedule:                           # weights that change along the run
        points: {0: {web: 1, books: 0}, 100: {web: 1, books: 1}}
        interpolation: step               # step | linear (a ramp)
        elements_per_step: 64             # the global batch: `at` counts training steps
        ramp_pieces: 100
      weight_by: elements                 # the only choice here (see below)

It builds ``dl.MapDataset.mix`` over one ``MapDataset.source`` per source, with fixed
weights or a :class:`~dataloader.WeightSchedule`; the loader reads the mixture's
positions in order (``sampler.sharding`` interleaves them over the hosts), so ``at``
counts the mixture's global stream and a restore, elastic too, is exact. With
``sampler.shuffle`` each source is shuffled on its own (its seed derived from
``sampler.seed`` and its place in the list), so the weights hold along the stream.
``sampler.num_epochs`` counts the passes over each source: ``k`` repeats each source ``k``
times (reshuffled each pass) and the mixture ends where the first source with weight
has run out of its ``k`` passes; ``null`` repeats each source for ever. Either way the
schedule runs along the whole run.

``weight_by: tokens`` is refused here: token weights need each element's length once it
is read, so that mixture runs at the iterator level (``dl.IterDataset.mix(...,
weight_by="tokens", length=f)`` in Python), not on the loader's positions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from dataloader.config import checks as check
from dataloader.config.source import SourceConfig, parse_source
from dataloader.dataset.compile.schedule import INTERPOLATIONS, WeightSchedule
from dataloader.dataset.map_dataset import MapDataset

_KEYS = ("sources", "weights", "schedule", "weight_by")
_SCHEDULE_KEYS = ("points", "interpolation", "elements_per_step", "ramp_pieces")


@dataclasses.dataclass(frozen=True)
class MixtureConfig:
    """``mixture:``: named sources and their weights (a list in the sources' order, a
    :class:`~dataloader.WeightSchedule`, or None: equal)."""

    names: tuple[str, ...]
    sources: tuple[SourceConfig, ...]
    weights: list[float] | WeightSchedule | None

    def build(self, shuffle: bool, seed: int | None, num_epochs: int | None) -> MapDataset:
        """The mixture as one random-access dataset, each source read ``num_epochs``
        times (None: for ever); see the module docstring."""
        components = []
        for i, source in enumerate(self.sources):
            ds = MapDataset.source(source.build())
            if shuffle:
                assert seed is not None, "checked at parse time"
                ds = ds.shuffle(seed=component_seed(seed, i))
            components.append(ds if num_epochs == 1 else ds.repeat(num_epochs))
        return MapDataset.mix(components, self.weights)


def component_seed(seed: int, index: int) -> int:
    """Source ``index``'s shuffle seed, from the sampler's seed (distinct per source)."""
    return int(np.random.SeedSequence([seed, index]).generate_state(1, dtype=np.uint32)[0])


def _weights(where: str, value: Any, names: tuple[str, ...]) -> list[float] | None:
    if value is None:
        return None
    weights = check.mapping(where, value)
    if set(weights) != set(names):
        missing, extra = sorted(set(names) - set(weights)), sorted(set(weights) - set(names))
        raise check.fail(where, f"expected one weight per source ({', '.join(names)}); "
                                f"missing {missing or 'none'}, unknown {extra or 'none'}")
    values = [check.number(check.sub(where, name), weights[name]) for name in names]
    for name, w in zip(names, values):
        if w < 0:
            raise check.fail(check.sub(where, name), f"expected a weight >= 0, got {w!r}")
    if sum(values) <= 0:
        raise check.fail(where, f"every weight is 0; give one source a weight > 0, got {weights!r}")
    return values


def _schedule(where: str, value: Any, names: tuple[str, ...]) -> WeightSchedule:
    section = check.mapping(where, value)
    check.known_keys(where, section, _SCHEDULE_KEYS)
    at = check.sub(where, "points")
    raw = check.get(section, "points", where=where)
    if isinstance(raw, Mapping):
        items = list(raw.items())
    elif isinstance(raw, list) and all(isinstance(p, list) and len(p) == 2 for p in raw):
        items = [tuple(p) for p in raw]
    else:
        raise check.fail(at, f"expected a mapping {{at: {{name: weight, ...}}, ...}} or a list of "
                             f"[at, {{name: weight, ...}}] pairs, got {raw!r}")
    if not items:
        raise check.fail(at, "expected at least one point, the first at 0")
    points = []
    for i, (step, weights) in enumerate(items):
        step = check.integer(f"{at}.{step}" if isinstance(raw, Mapping) else check.sub(at, i), step, low=0)
        where_point = check.sub(at, step if isinstance(raw, Mapping) else i)
        values = _weights(where_point, weights, names)
        assert values is not None
        points.append((step, values))
    interpolation = check.string(check.sub(where, "interpolation"), section.get("interpolation", "step"),
                                 choices=INTERPOLATIONS)
    per_step = check.integer(check.sub(where, "elements_per_step"), section.get("elements_per_step", 1), low=1)
    pieces = check.integer(check.sub(where, "ramp_pieces"), section.get("ramp_pieces", 100), low=1)
    try:
        return WeightSchedule(points, interpolation=interpolation, elements_per_step=per_step, ramp_pieces=pieces)
    except (TypeError, ValueError) as error:
        raise check.fail(at, f"{error}; points are the weights from `at` on, the first at 0, `at` increasing") from None


def parse_mixture(section: Any, check_files: bool = True) -> MixtureConfig:
    """Checks a ``mixture:`` section (see the module docstring).

    Raises:
        ConfigError: naming the key, the value and what to do.
    """
    where = "mixture"
    section = check.mapping(where, section)
    check.known_keys(where, section, _KEYS)
    at = check.sub(where, "sources")
    sources = section.get("sources")
    if not isinstance(sources, Mapping) or not sources:
        raise check.fail(at, f"expected a mapping of names to source sections, e.g. {{web: {{kind: "
                             f"array_record, paths: web-*.array_record}}}}, got {sources!r}")
    sources = check.mapping(at, sources)
    names = tuple(sources)
    built = tuple(parse_source(check.sub(at, name), check.mapping(check.sub(at, name), sources[name]), check_files)
                  for name in names)
    by = check.string(check.sub(where, "weight_by"), section.get("weight_by", "elements"), choices=("elements", "tokens"))
    if by == "tokens":
        raise check.fail(check.sub(where, "weight_by"), "tokens needs each element's length once it is read, "
                         "so that mixture runs at the iterator level, not on the loader's positions; "
                         "use dl.IterDataset.mix(..., weight_by='tokens', length=f) in Python, or weight_by: elements")
    if section.get("weights") is not None and section.get("schedule") is not None:
        raise check.fail(where, "give weights (fixed) or schedule (changing), not both")
    weights: list[float] | WeightSchedule | None = _weights(check.sub(where, "weights"), section.get("weights"), names)
    if section.get("schedule") is not None:
        weights = _schedule(check.sub(where, "schedule"), section["schedule"], names)
    return MixtureConfig(names, built, weights)
