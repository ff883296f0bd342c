"""Streams the experimental-dataset tests share: a user's own source that counts its reads."""

from __future__ import annotations

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
