"""Helpers of the unit-sizing tests: forced unit sizes, and whole runs to compare.

Sizes are forced from a seeded random choice in the test process, where units are
made (the pool's workers only compute the ranges they are sent), so no test depends
on timing. The reference is the same loader with fixed units of its grid's size.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

import dataloader as dl
from dataloader.engine.sizing import UnitSizer
from tests.dataloader.pipelines import make_loader

MIXED = [1, 2, 3, 5, 7, 300]


def force_sizes(monkeypatch: pytest.MonkeyPatch, choices: list[int], seed: int = 0) -> None:
    """Every unit made from now on has a size drawn from ``choices``."""
    rng = random.Random(seed)
    monkeypatch.setattr(UnitSizer, "next_size", lambda self: rng.choice(choices))


def run(loader: Any, state: Any = None) -> tuple[list[Any], list[Any]]:
    """Every element, and the state before the first and after each (through JSON)."""
    it = iter(loader)
    if state is not None:
        it.set_state(state)
    states, out = [it.get_state()], []
    for x in it:
        out.append(x)
        states.append(json.loads(json.dumps(it.get_state())))
    it.close()
    return out, states


def fixed(name: str, **kw: Any) -> Any:
    """The pipeline ``name`` with fixed units of its grid's size (its default unit size)."""
    grid = make_loader(name, **kw).plan.unit_size
    return make_loader(name, read_options=dl.ReadOptions(unit_size=grid), **kw)
