"""Streams the experimental-dataset tests share: a user's own source that counts its reads,
and a run of ``ElasticIterator`` shards through restores on other shard counts."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import dataloader as dl


class Counted(dl.IterDataset):
    """``values`` in order, from a user-written iterator; ``reads[0]`` counts ``next`` calls
    that returned an element, over all iterators of this dataset."""

    def __init__(self, values: list[Any]) -> None:
        super().__init__()
        self.values = list(values)
        self.reads = [0]

    def __iter__(self) -> CountedIterator:
        return CountedIterator(self)


class CountedIterator(dl.DatasetIterator):
    def __init__(self, ds: Counted) -> None:
        super().__init__()
        self._ds, self._i = ds, 0

    def __next__(self) -> Any:
        if self._i >= len(self._ds.values):
            raise StopIteration
        self._i += 1
        self._ds.reads[0] += 1
        return self._ds.values[self._i - 1]

    def get_state(self) -> dict[str, Any]:
        return {"i": self._i}

    def set_state(self, state: dict[str, Any]) -> None:
        self._i = state["i"]


def engine_stream(n: int = 30, seed: int = 5) -> dl.IterDataset:
    """A shuffled, filtered, mapped engine-backed stream of dicts (values 0..n-1, no multiples of 7)."""
    return (dl.MapDataset.range(n).seed(seed).shuffle().map(lambda x: {"x": np.int64(x)})
            .to_iter_dataset().filter(lambda e: e["x"] % 7 != 0))


def run_on_shard_counts(make: Callable[[int, int], Any], ids: Callable[[Any], list[Any]],
                        phases: Sequence[tuple[int, int | None]]) -> list[Any]:
    """``make(shard, count)`` (an ``ElasticIterator``) through ``phases`` of ``(count,
    steps)`` (None: to the end); each phase restores from the union of the last one's
    ``get_shard_states()`` through JSON (whose keys are strings). Returns what ``ids``
    reads of every output."""
    used: list[Any] = []
    states: dict[Any, Any] = {}
    for count, steps in phases:
        its = [make(h, count) for h in range(count)]
        for it in its:
            if states:
                it.set_shard_states(states)
            taken = 0
            while steps is None or taken < steps:
                try:
                    used += ids(next(it))
                except StopIteration:
                    break
                taken += 1
        states = {}
        for it in its:
            states.update(json.loads(json.dumps(it.get_shard_states())))
            it.close()
    return used
