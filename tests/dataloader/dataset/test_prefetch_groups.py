"""The prefetch thread hands over in groups what its source already holds computed
(``DatasetIterator.ready``), and computes no more than its buffer ahead of the consumer
(:mod:`dataloader.dataset.transformations.prefetch`)."""

from __future__ import annotations

import time

import pytest

import dataloader as dl
from dataloader.dataset.base import DatasetIterator
from dataloader.dataset.transformations.prefetch import _Producer
from dataloader.engine.stages.shipped import ShippedElementwiseIterator
from tests.helpers import wait_until

pytestmark = pytest.mark.timeout(120)


class Grouped(DatasetIterator):
    """``0, 1, ...`` up to ``n``, computed ``group`` at a time: after the first element of
    a group, the rest are held (``ready()``). ``computed`` counts computed elements."""

    def __init__(self, n: int, group: int) -> None:
        super().__init__()
        self.n, self.group = n, group
        self.i = 0
        self.computed = 0

    def __next__(self) -> int:
        if self.i >= self.n:
            raise StopIteration
        if self.i % self.group == 0:
            self.computed = min(self.i + self.group, self.n)
        self.i += 1
        return self.i - 1

    def ready(self) -> int:
        return self.computed - self.i

    def get_state(self) -> dict[str, int]:
        return {"i": self.i}

    def set_state(self, state: dict[str, int]) -> None:
        self.i = self.computed = state["i"]


class Ungrouped(Grouped):
    """The same elements, from a source that cannot tell what it holds."""

    def ready(self) -> int:
        return 0


def settle() -> None:
    """Lets a thread that should now be waiting run on, if it wrongly would."""
    time.sleep(0.3)


def test_a_thread_computes_at_most_its_buffer_ahead_of_the_consumer():
    source = Ungrouped(100, group=1)
    it = dl.experimental.ThreadPrefetchDatasetIterator(source, prefetch_buffer_size=3)
    assert next(it) == 0
    assert wait_until(lambda: source.computed == 1 + 3)
    settle()
    assert source.computed == 4
    it.close()


def test_what_the_source_holds_goes_over_in_one_group():
    producer = _Producer(Grouped(20, group=5), size=2)
    try:
        groups = [[value for _, value, _ in _all(producer)] for _ in range(4)]
    finally:
        producer.stop()
    assert groups == [list(range(k, k + 5)) for k in (0, 5, 10, 15)]


class Counted(Grouped):
    """Grouped, counting the calls of ``ready()``."""

    def __init__(self, n: int, group: int) -> None:
        super().__init__(n, group)
        self.asked = 0

    def ready(self) -> int:
        self.asked += 1
        return super().ready()


def test_the_thread_asks_what_the_source_holds_once_a_group_not_once_an_element():
    """ready() says how many next() calls return held outputs: the thread counts those
    down rather than asking after every element (a call per element cost the trainer)."""
    source = Counted(20, group=5)
    it = dl.experimental.ThreadPrefetchDatasetIterator(source, prefetch_buffer_size=2)
    assert list(it) == list(range(20))
    assert source.asked <= 2 * 4  # after a group's first element, and after its last


def _all(producer: _Producer) -> list:
    """One group, taken whole."""
    first = producer.get()
    return [first] + [producer.get() for _ in range(len(producer._group) - 1)]


def test_a_group_may_pass_the_buffer_but_nothing_more_is_computed_until_it_is_taken():
    source = Grouped(100, group=5)
    it = dl.experimental.ThreadPrefetchDatasetIterator(source, prefetch_buffer_size=2)
    it.start_prefetch()
    assert wait_until(lambda: source.i == 5)
    settle()
    assert source.i == 5  # the group (5 > 2) was held already; no next group is asked for
    assert next(it) == 0  # the consumer takes the group: room for the next one
    assert wait_until(lambda: source.i == 10)
    settle()
    assert source.i == 10
    assert [next(it) for _ in range(9)] == list(range(1, 10))
    it.close()


@pytest.mark.parametrize("source", [Grouped(23, group=4), Ungrouped(23, group=4)], ids=["grouped", "ungrouped"])
def test_groups_change_no_element_and_no_state(source):
    it = dl.experimental.ThreadPrefetchDatasetIterator(source, prefetch_buffer_size=3)
    seen = []
    for value in it:
        seen.append((value, it.get_state()))
    assert seen == [(i, {"i": i + 1}) for i in range(23)]


def test_a_shipped_stage_says_how_many_outputs_of_its_unit_are_left():
    parent = iter(dl.MapDataset.range(10).to_iter_dataset())
    stage = ShippedElementwiseIterator(
        parent, (dl.MapTransform(lambda x: x * 2),), dl.MultiprocessingOptions(num_workers=0), unit_size=4
    )
    left = []
    for _ in range(10):
        next(stage)
        left.append(stage.ready())
    assert left == [3, 2, 1, 0, 3, 2, 1, 0, 1, 0]
    stage.close()
