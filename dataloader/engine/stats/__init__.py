"""Where the time goes: the counters behind every iterator's ``stats()``.

* :mod:`.shape`: the totals every iterator keeps and the one dict ``stats()`` returns;
* :mod:`.units`: the engine's counters, per work unit (:class:`Stats`, :class:`Counted`);
* :mod:`.clock`: each iterator's time in ``next()``, the rolling window, the hooks;
* :mod:`.collect`: ``stats()`` of a chain of iterators (stages over engines);
* :mod:`.advice`: rules over a ``stats()`` dict that name a cause and its remedy;
* :mod:`.text`: one line of it, for progress bars and logs (:func:`log_stats`);
* :mod:`.pipeline`: what the pipeline is (``stats()["pipeline"]``);
* :mod:`.filters`: Grain's filter thresholds (:class:`FilterWatch`).
"""

from dataloader.engine.stats.advice import Advice, advise
from dataloader.engine.stats.clock import WINDOW_S, Clock
from dataloader.engine.stats.filters import FilterWatch
from dataloader.engine.stats.shape import flatten, sorted_stages
from dataloader.engine.stats.text import log_stats, summary_line
from dataloader.engine.stats.units import Counted, Stats, UnitRecord

flatten_stats = flatten  # the public name (dl.flatten_stats)

__all__ = [
    "WINDOW_S",
    "Advice",
    "Clock",
    "Counted",
    "FilterWatch",
    "Stats",
    "UnitRecord",
    "advise",
    "flatten",
    "flatten_stats",
    "log_stats",
    "sorted_stages",
    "summary_line",
]
