"""Where the time goes: the counters behind every iterator's ``stats()``.

* :mod:`.shape`: the totals every iterator keeps and the one dict ``stats()`` returns;
* :mod:`.units`: the engine's counters, per work unit (:class:`Stats`, :class:`Counted`);
* :mod:`.clock`: each iterator's time in ``next()``, the rolling window, the hooks;
* :mod:`.collect`: ``stats()`` of a chain of iterators (stages over engines);
* :mod:`.advice`: rules over a ``stats()`` dict that name a cause and its remedy;
* :mod:`.filters`: Grain's filter thresholds (:class:`FilterWatch`).
"""

from dataloader.engine.stats.clock import WINDOW_S, Clock
from dataloader.engine.stats.filters import FilterWatch
from dataloader.engine.stats.shape import flatten, sorted_stages
from dataloader.engine.stats.units import Counted, Stats, UnitRecord

__all__ = [
    "WINDOW_S",
    "Clock",
    "Counted",
    "FilterWatch",
    "Stats",
    "UnitRecord",
    "flatten",
    "sorted_stages",
]
