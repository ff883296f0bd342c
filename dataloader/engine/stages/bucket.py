"""The stage of a bucket-by-length batcher (:class:`dataloader.operations.BucketByLength`).

It runs in the consumer's process on the ordered stream, so its batches never depend on
the number of workers. Its state is small: the parent's state before the oldest element
still waiting in a bucket, how many elements were read since, and which of them are
still waiting (offsets, at most the sum of the batch sizes). A restore reads the
elements from that point again and puts the waiting ones back in their buckets: it
replays at most the stretch of stream the buckets currently span, never the whole
stream, and stores no element.
"""

from __future__ import annotations

from typing import Any

from dataloader.engine.compute import call_user
from dataloader.engine.stages.base import DatasetIterator, expect_state
from dataloader.errors import StateMismatchError


class BucketIterator(DatasetIterator):
    """Groups the parent's elements by bucket and hands out each bucket's batches."""

    stats_batches = True  # stats(): each output is a batch of the parent's elements

    def __init__(self, parent: DatasetIterator, op: Any) -> None:
        super().__init__(parent)
        self._op, self.stats_name = op, op.name
        # Per bucket: (offset read, element, the parent's state before it), oldest first.
        self._buckets: list[list[tuple[int, Any, Any]]] = [[] for _ in op.batch_sizes]
        self._read, self._ended = 0, False  # elements read from the parent; it ended

    def __next__(self) -> Any:
        while not self._ended:
            before = self._parent.get_state()
            try:
                element = next(self._parent)
            except StopIteration:
                self._ended = True
                break
            offset, self._read = self._read, self._read + 1
            bucket = self._call(offset, self._op.bucket_of, element)
            waiting = self._buckets[bucket]
            waiting.append((offset, element, before))
            if len(waiting) == self._op.batch_sizes[bucket]:
                return self._emit(bucket)
        for bucket, waiting in enumerate(self._buckets):
            if waiting and not self._op.drop_remainder:
                return self._emit(bucket)
        raise StopIteration

    def _emit(self, bucket: int) -> Any:
        waiting, self._buckets[bucket] = self._buckets[bucket], []
        return self._call(waiting[0][0], self._op.batch_fn, bucket, [e for _, e, _ in waiting])

    def _call(self, offset: int, fn: Any, *args: Any) -> Any:
        """``fn(*args)``, its errors naming the operation and the element's offset."""
        return call_user(self._op.name, lambda: f"at element {offset} of the stream of {self._parent!r}", fn, *args)

    def get_state(self) -> dict[str, Any]:
        waiting = sorted((o, b) for o, _, b in (w for ws in self._buckets for w in ws))
        if self._ended and (self._op.drop_remainder or not waiting):
            waiting = []
        first, parent = (waiting[0] if waiting else (self._read, self._parent.get_state()))
        return {
            "parent": parent,
            "read": self._read - first,
            "waiting": [o - first for o, _ in waiting],
            "bucketing": self._op.describe(),
        }

    def set_state(self, state: dict[str, Any]) -> None:
        state = expect_state(state, ("parent", "read", "waiting", "bucketing"), "a bucket-by-length batcher")
        if state["bucketing"] != self._op.describe():
            raise StateMismatchError(
                f"this state was saved by the bucketing {state['bucketing']}, but this stage "
                f"buckets by {self._op.describe()}; keep the operation as it was"
            )
        self._parent.set_state(state["parent"])
        self._buckets = [[] for _ in self._op.batch_sizes]
        self._ended, self._read = False, 0
        waiting = {int(o) for o in state["waiting"]}
        for offset in range(int(state["read"])):
            before = self._parent.get_state() if offset in waiting else None
            element = next(self._parent)
            if offset in waiting:
                self._buckets[self._op.bucket_of(element)].append((offset, element, before))
        self._read = int(state["read"])
