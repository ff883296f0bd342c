"""``StatsParticipant``: what an iterator provides to take part in ``stats()``.

Written once here, read by :mod:`.collect` (and the stages that add up their parents'
numbers) with ``isinstance``. Every :class:`~dataloader.DatasetIterator` takes part by
inheritance: its defaults add up its parents' totals and name it after its class, so a
user's own iterator does nothing. A class overrides a member only to say something
its defaults cannot (see each member). An iterator that does not take part (a plain
generator fed to the device feed, say) is skipped: it contributes no numbers.

The members are underscored: they are the package's hooks, not a user's API.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from dataloader.engine.stats.clock import Clock


@runtime_checkable
class StatsParticipant(Protocol):
    """An iterator whose ``stats()`` adds up with the iterators under and above it.

    Obligations:

    * ``stats_clock``: None until :func:`~dataloader.engine.stats.collect.clock_of` makes
      the iterator's :class:`Clock` on first use; its ``__next__`` runs under that clock
      (``DatasetIterator`` wraps every subclass's ``__next__`` once, when the class is
      made), so the clock counts its outputs and its time in ``next()``.
    * ``stats_name``: its stage name in ``stage_seconds``: ``""`` for the class's
      name, None for no stage of its own (it only passes its parents' outputs on, or,
      like the loader's iterator, its engine names its stages).
    * ``stats_batches``: True if it makes batches of its parent's elements (it counts
      its outputs as ``batches_out`` and its parents' as ``elements_out``), False if it
      makes elements (a packer's rows), None if it hands out what its parent does.
    * ``stats_exact``: True to time every call, never one in a sample: calls that are
      a training step's (the device feed), where an estimate would blur the step's wait.
    * ``stats_totals()``: its totals in the shape of
      :func:`~dataloader.engine.stats.shape.empty_totals`, everything under it
      included; cheap enough to be called about once a second from ``next()``, in the
      consumer's thread, and never blocking.
    * ``stats_parents()``: the iterators whose totals it adds up (its parents; an
      interleave's open streams); those that take part are added, the rest skipped.
    * ``stats_pipeline()``: a new JSON-able dict describing the pipeline under it
      (``stats()["pipeline"]``); the caller may change it.
    """

    stats_clock: Clock | None
    stats_name: str | None
    stats_batches: bool | None
    stats_exact: bool

    def stats_totals(self) -> dict[str, Any]: ...

    def stats_parents(self) -> Sequence[Any]: ...

    def stats_pipeline(self) -> dict[str, Any]: ...
