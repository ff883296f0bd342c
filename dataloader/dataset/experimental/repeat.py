"""``RepeatIterDataset``: a stream iterated ``num_epochs`` times (for ever with ``None``).

Every epoch is the same stream, as in Grain: the parent iterator goes back to the state
it started from (``set_state``), so engine-backed ancestors keep their worker
processes, and no element is cached. The state is the epoch and the parent's state, so
a restore costs what the parent's restore costs.
"""

from __future__ import annotations

from typing import Any, TypeVar

from dataloader.dataset.arguments import check_size
from dataloader.dataset.base import DatasetIterator, IterDataset
from dataloader.dataset.experimental.checks import as_iter_dataset
from dataloader.engine.stages.base import expect_state

T = TypeVar("T")


class RepeatIterDataset(IterDataset[T]):
    """``parent`` iterated ``num_epochs`` times, or for ever when it is ``None``.

    Unlike ``MapDataset.repeat`` (a new shuffle per epoch), every epoch is identical.
    A parent whose epoch is empty ends the repetition at once rather than spinning.

    Args:
        parent: the stream to repeat (finite: an endless one never reaches epoch 2).
        num_epochs: a positive integer, or ``None`` for ever.

    Example:
        >>> import dataloader as dl
        >>> ds = dl.MapDataset.range(3).to_iter_dataset()
        >>> list(dl.experimental.RepeatIterDataset(ds, num_epochs=2))
        [0, 1, 2, 0, 1, 2]
    """

    def __init__(self, parent: IterDataset[T], num_epochs: int | None = None) -> None:
        super().__init__(as_iter_dataset(parent, "RepeatIterDataset"))
        if num_epochs is not None:
            num_epochs = check_size(num_epochs, "RepeatIterDataset num_epochs")
        self._num_epochs = num_epochs

    def __iter__(self) -> RepeatDatasetIterator[T]:
        return RepeatDatasetIterator(iter(self._parent), self._num_epochs)

    def __repr__(self) -> str:
        return f"RepeatIterDataset({self._parent!r}, num_epochs={self._num_epochs})"


class RepeatDatasetIterator(DatasetIterator[T]):
    """Restarts the parent from its first state each time it ends."""

    def __init__(self, parent: DatasetIterator[T], num_epochs: int | None) -> None:
        super().__init__(parent)
        self._num_epochs = num_epochs
        self._epoch = 0
        self._start = parent.get_state()
        self._any = False  # whether this epoch handed anything out

    def __next__(self) -> T:
        while self._num_epochs is None or self._epoch < self._num_epochs:
            try:
                value = next(self._parent)
            except StopIteration:
                if not self._any:  # an empty epoch; all epochs are the same, so all are empty
                    raise
                self._epoch += 1
                self._any = False
                if self._num_epochs is None or self._epoch < self._num_epochs:
                    self._parent.set_state(self._start)
                continue
            self._any = True
            return value
        raise StopIteration

    def get_state(self) -> dict[str, Any]:
        return {"parent": self._parent.get_state(), "epoch": self._epoch}

    def set_state(self, state: dict[str, Any]) -> None:
        state = expect_state(state, ("parent", "epoch"), "RepeatIterDataset")
        self._parent.set_state(state["parent"])
        self._epoch = int(state["epoch"])
        # A restored epoch may have handed out elements before the state was taken.
        self._any = state["parent"] != self._start
