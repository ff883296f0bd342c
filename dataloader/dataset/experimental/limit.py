"""``LimitIterDataset``: the first ``count`` elements of a stream, as in Grain.

Example:
    >>> import dataloader as dl
    >>> list(dl.experimental.LimitIterDataset(dl.MapDataset.range(5).to_iter_dataset(), 2))
    [0, 1]
"""

from __future__ import annotations

from typing import Any, TypeVar

from dataloader.dataset.arguments import check_size
from dataloader.dataset.base import DatasetIterator, IterDataset
from dataloader.dataset.experimental.checks import as_iter_dataset
from dataloader.dataset.transformations.apply import set_next_index
from dataloader.engine.stages.base import expect_state

T = TypeVar("T")


class LimitIterDataset(IterDataset[T]):
    """At most ``count`` elements of ``parent`` (fewer if it ends first).

    Args:
        parent: the stream to cut.
        count: how many elements to hand out, a positive integer (Grain refuses 0 too).

    Raises:
        ValueError: ``count`` is not a positive integer.
    """

    def __init__(self, parent: IterDataset[T], count: int) -> None:
        super().__init__(as_iter_dataset(parent, "LimitIterDataset"))
        self._count = check_size(count, "LimitIterDataset count")

    def __iter__(self) -> LimitDatasetIterator[T]:
        return LimitDatasetIterator(iter(self._parent), self._count)

    def __repr__(self) -> str:
        return f"LimitIterDataset({self._parent!r}, count={self._count})"


class LimitDatasetIterator(DatasetIterator[T]):
    """Hands out the parent's elements until ``count`` of them went out.

    Its state is the parent's and the number handed out; once ``count`` is reached the
    parent is not read again (so nothing past the limit is computed in this thread).
    Its next index is the number handed out, and ``set_next_index`` moves the parent
    there, where the parent can (as Grain's).
    """

    def __init__(self, parent: DatasetIterator[T], count: int) -> None:
        super().__init__(parent)
        self._count = count
        self._read = 0

    def __next__(self) -> T:
        if self._read >= self._count:
            raise StopIteration
        value = next(self._parent)
        self._read += 1
        return value

    def get_state(self) -> dict[str, Any]:
        return {"parent": self._parent.get_state(), "count_elements_read": self._read}

    def set_state(self, state: dict[str, Any]) -> None:
        state = expect_state(state, ("parent", "count_elements_read"), "LimitIterDataset")
        self._parent.set_state(state["parent"])
        self._read = int(state["count_elements_read"])

    def _get_next_index(self) -> int:
        return self._read

    def _set_next_index(self, index: int) -> None:
        set_next_index(self._parent, index)
        self._read = index
