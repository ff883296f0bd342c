"""What ``run --report`` records while the pipeline runs, for the report's plots.

Every ``SAMPLE_S`` seconds (checked after each batch) the :class:`Recorder` notes the
top iterator's running totals (for throughput over time) and copies the units the
engines logged since the last look (who computed each and when: the timeline and the
queue depths); at the end it takes the device feed's queue samples. Each engine keeps
its last :data:`~dataloader.engine.stats.units.LOG_UNITS` units, and the recorder looks
often enough that none is missed below about 40,000 units a second. A long run keeps
at most ``MAX_SAMPLES`` samples: past that, every other one is dropped and the interval
doubles.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from dataloader.engine.stats import collect

SAMPLE_S = 0.1
MAX_SAMPLES = 2000


class Sample(NamedTuple):
    """The top iterator's totals at one moment (``time.monotonic()`` seconds)."""

    at: float
    records_read: int
    elements_out: int
    batches_out: int
    wait_s: float


class Recorder:
    """Samples an iterator (a loader's, a stage's or the device feed's) during a run.

    Attributes:
        started: when the first iterator under ``it`` was made (``time.monotonic()``);
            plots count from it.
        samples: the totals, every ``SAMPLE_S`` seconds.
        units: ``(engine number, UnitRecord)`` of every unit the engines computed.
        depths: the device feed's queue samples (``feed.Depth``), if there is one.
    """

    def __init__(self, it: Any) -> None:
        self._it = it
        self._engines = collect.engines(it)
        self._seen = [0] * len(self._engines)
        self.started = min([time.monotonic(), *(e.unit_stats.started for e in self._engines)])
        self._every = SAMPLE_S
        self.samples: list[Sample] = []
        self.units: list[tuple[int, Any]] = []
        self.depths: list[Any] = []
        self._due = 0.0
        self.tick(force=True)

    def tick(self, force: bool = False) -> None:
        """Takes a sample if ``SAMPLE_S`` has passed since the last one (or ``force``)."""
        now = time.monotonic()
        if not force and now < self._due:
            return
        self._due = now + self._every
        if len(self.samples) >= MAX_SAMPLES:
            self.samples, self._every = self.samples[::2], self._every * 2
        totals = self._it.stats_totals()
        self.samples.append(Sample(now, totals["records_read"], totals["elements_out"],
                                   totals["batches_out"], totals["wait_s"]))
        for i, engine in enumerate(self._engines):
            fresh = engine.unit_stats.log_since(self._seen[i])
            if fresh:
                self._seen[i] = fresh[-1].seq + 1
                self.units += [(i, record) for record in fresh]

    def finish(self) -> None:
        """The last sample, and the device feed's queue samples."""
        self.tick(force=True)
        self.depths = list(getattr(self._it, "depth_samples", []))
