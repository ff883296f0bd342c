"""What a weight schedule and token weighting cost per record, beside fixed weights.

In-memory components (``MapDataset.range``, so reading costs nothing and the mixing is
what is measured), ``--components`` of them, unequal weights, in this process
(``worker_count=0``), ``--records`` records a run after a warm-up, median of
``--repeat`` runs, in microseconds per record, side by side in one run:

* **locating** 32 consecutive positions (what the engine asks for a batch): ``MixSchedule``
  against the bound schedules, the mixing's own cost without the engine around it;
* **on the engine** (``MapDataset.mix(...).batch(32).to_iter_dataset()``): fixed weights,
  a ``WeightSchedule`` of steps (a switch every ``records / 4`` positions), and a linear
  ramp over the whole run (100 pieces);
* **at the iterator level** (``IterDataset.mix`` of a dict of streams, elements one at
  a time): fixed weights, a schedule of steps, and ``weight_by="tokens"`` with a length
  function (fixed weights; then with the schedule of steps counted in tokens).

    python benchmarks/mixture_weights.py
    python benchmarks/mixture_weights.py --components 64 --records 20000
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np

import dataloader as dl


def length(element: int) -> int:
    return 1 + (int(element) * 2654435761) % 997


def _timed(make: Callable[[], Any], records: int, per_output: int) -> float:
    it = iter(make())
    for _ in range(max(1, 200 // per_output)):
        next(it)  # warm-up: the first batch starts the engine
    start = time.perf_counter()
    for _ in range(records // per_output):
        next(it)
    return (time.perf_counter() - start) / records * 1e6


def _locating(schedule: Any) -> Callable[[], Any]:
    """An iterator that locates 32 consecutive positions a ``next``: the mixing alone."""

    def make() -> Any:
        return (schedule.locate(np.arange(p, p + 32)) for p in itertools.count(0, 32))

    return make


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--components", type=int, default=8)
    parser.add_argument("--records", type=int, default=8192)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    n, records = args.components, args.records
    weights = [1 + i % 7 for i in range(n)]
    quarter = records // 4
    steps = dl.WeightSchedule([(i * quarter, [1 + (i + c) % 7 for c in range(n)]) for i in range(8)])
    ramp = dl.WeightSchedule([(0, weights), (records * 2, weights[::-1])], interpolation="linear")
    names = [f"c{i:03d}" for i in range(n)]
    named_steps = dl.WeightSchedule([(at, dict(zip(names, w))) for at, w in steps.points])
    token_steps = dl.WeightSchedule([(at * 500, dict(zip(names, w))) for at, w in steps.points])

    def parts() -> list[Any]:
        return [dl.MapDataset.range(c * 10**7, (c + 1) * 10**7).repeat() for c in range(n)]

    def engine(w: Any) -> Callable[[], Any]:
        return lambda: dl.MapDataset.mix(parts(), w).batch(32).to_iter_dataset()

    def streams() -> dict[str, Any]:
        return {k: p.to_iter_dataset() for k, p in zip(names, parts())}

    def iterator_level(w: Any, **kwargs: Any) -> Callable[[], Any]:
        return lambda: dl.IterDataset.mix(streams(), w, **kwargs)

    fixed_named = dict(zip(names, weights))
    rows = [
        ("engine, batch(32)", [("fixed", engine(weights), 32), ("steps", engine(steps), 32),
                               ("ramp", engine(ramp), 32)]),
        ("iterator level", [("fixed", iterator_level(fixed_named), 1), ("steps", iterator_level(named_steps), 1),
                            ("tokens", iterator_level(fixed_named, weight_by="tokens", length=length), 1),
                            ("tokens+steps", iterator_level(token_steps, weight_by="tokens", length=length), 1)]),
    ]
    fixed_mix, steps_mix, ramp_mix = dl.MixSchedule(weights), steps.bind(n), ramp.bind(n)
    locate = [("fixed", fixed_mix), ("steps", steps_mix), ("ramp", ramp_mix)]
    rows.insert(0, ("locate only, 32", [(name, _locating(m), 32) for name, m in locate]))
    print(f"{n} components, {records} records a run, median of {args.repeat}; µs per record")
    for title, cases in rows:
        runs: list[list[float]] = [[] for _ in cases]
        for _ in range(args.repeat):  # the cases in turn, so a change in load touches all
            for i, (_, make, per_output) in enumerate(cases):
                runs[i].append(_timed(make, records, per_output))
        figures = [(name, statistics.median(r)) for (name, _, _), r in zip(cases, runs)]
        base = figures[0][1]
        cells = "  ".join(f"{name} {us:7.2f} ({us - base:+6.2f})" for name, us in figures)
        print(f"{title:<20} {cells}")


if __name__ == "__main__":
    main()
