"""Window shuffle of a stream: ``window_size`` elements at a time, each window permuted.

The iterator of Grain's ``WindowShuffleIterDataset``. It reads the next
``window_size`` elements of its parent (fewer at the end of the stream) and hands them
out in the order of the stateless permutation :func:`~dataloader.samplers.permute`
keyed by ``(seed, window number)``: a new, unrelated permutation for every window,
computed from integers alone, so the order never depends on timing or restores.

Memory: one window of elements. State: the parent's state before the window, the
window's number and how many of its elements were handed out; once a window is handed
out, the state moves to the start of the next one. A restore re-reads that one window
(at most ``window_size - 1`` elements read again), never the stream.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dataloader.engine.stages.base import DatasetIterator, expect_state
from dataloader.errors import StateMismatchError
from dataloader.samplers import permute


def window_order(size: int, seed: int, window: int) -> list[int]:
    """The order in which a window of ``size`` elements is handed out."""
    if size <= 1:
        return list(range(size))
    return permute(np.arange(size), size, seed, window).tolist()


class WindowShuffleDatasetIterator(DatasetIterator):
    """Hands out the parent's elements window by window, each window permuted."""

    def __init__(self, parent: DatasetIterator, window_size: int, seed: int) -> None:
        super().__init__(parent)
        self._size = window_size
        self._seed = seed
        self._window = 0  # number of the current window (or of the next, between windows)
        self._start: Any = None  # the parent's state before the current window
        self._elements: list[Any] = []  # the current window, in the order handed out
        self._given = 0
        self._ended = False

    def _fill(self) -> None:
        self._start = self._parent.get_state()
        elements = []
        for _ in range(self._size):
            try:
                elements.append(next(self._parent))
            except StopIteration:
                self._ended = True
                break
        order = window_order(len(elements), self._seed, self._window)
        self._elements = [elements[k] for k in order]
        self._given = 0

    def __next__(self) -> Any:
        if self._given >= len(self._elements):
            if self._elements:  # the window is handed out: the next one starts
                self._window += 1
                self._elements, self._given = [], 0
            if self._ended:
                raise StopIteration
            self._fill()
            if not self._elements:
                raise StopIteration
        element = self._elements[self._given]
        self._given += 1
        return element

    def get_state(self) -> dict[str, Any]:
        if self._elements and self._given < len(self._elements):
            parent, window, given = self._start, self._window, self._given
        else:  # between windows: the state of the next window's start
            parent = self._parent.get_state()
            window, given = self._window + (1 if self._elements else 0), 0
        return {"parent": parent, "window_index": window, "pos_in_window": given,
                "window_size": self._size, "seed": self._seed}

    def set_state(self, state: dict[str, Any]) -> None:
        expect_state(state, ("parent", "window_index", "pos_in_window"), "a window shuffle")
        saved = (state.get("window_size"), state.get("seed"))
        if saved != (self._size, self._seed):
            raise StateMismatchError(
                f"this state was saved by a window shuffle with window_size={saved[0]} and "
                f"seed={saved[1]} but this one has window_size={self._size} and seed="
                f"{self._seed}; restore with the arguments the state was made for"
            )
        self._parent.set_state(state["parent"])
        self._window = int(state["window_index"])
        self._elements, self._given, self._ended = [], 0, False
        given = int(state["pos_in_window"])
        if given:
            self._fill()
            self._given = min(given, len(self._elements))
