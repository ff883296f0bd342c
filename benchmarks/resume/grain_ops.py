"""Grain's transforms are classes: the per-record functions of :mod:`.common` as Grain
transforms, in a module of their own (it imports Grain, so only Grain's columns import
it; worker processes find the classes here by name)."""

from __future__ import annotations

from absl import flags

# Grain reads absl flags when it starts workers; a program not run by absl.app has to
# mark them parsed (peers.py does the same).
if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()

import grain.experimental as ge
import grain.python as gp

from resume import common


def _map(name: str, fn):
    """A Grain ``MapTransform`` class calling ``fn``, named ``name`` in this module (so
    worker processes unpickle it by name)."""
    cls = type(name, (gp.MapTransform,), {"map": lambda self, element: fn(element), "__module__": __name__})
    cls.__qualname__ = name
    return cls


Decode = _map("Decode", common.decode)
IdOnly = _map("IdOnly", common.id_only)
TokensOnly = _map("TokensOnly", common.tokens_only)
ShiftB = _map("ShiftB", common.shift_b)


class Keep(gp.FilterTransform):
    def filter(self, element):
        return common.keep(element)


class FanOut(ge.FlatMapTransform):
    max_fan_out = 3

    def flat_map(self, element):
        return common.fan_out(element)
