"""Iterator-level datasets: a user's own IterDataset, chained calls after it, thread and
process prefetch over it; all checkpointable at every step and independent of workers."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import dataloader as dl
from tests.helpers import assert_restores_everywhere, assert_streams_equal


class Squares(dl.IterDataset[int]):
    """A source of the user's own: 0, 1, 4, 9, ... (``count`` of them)."""

    def __init__(self, count: int) -> None:
        super().__init__()
        self.count = count

    def __iter__(self) -> SquaresIterator:
        return SquaresIterator(self.count)


class SquaresIterator(dl.DatasetIterator[int]):
    def __init__(self, count: int) -> None:
        super().__init__()
        self._i, self._count = 0, count

    def __next__(self) -> int:
        if self._i >= self._count:
            raise StopIteration
        self._i += 1
        return (self._i - 1) ** 2

    def get_state(self) -> dict[str, Any]:
        return {"i": self._i}

    def set_state(self, state: dict[str, Any]) -> None:
        self._i = state["i"]


class RunningSum(dl.IterDataset):
    """A stateful transformation of the user's own: the running sum of its parent."""

    def __init__(self, parent: dl.IterDataset) -> None:
        super().__init__(parent)

    def __iter__(self) -> RunningSumIterator:
        return RunningSumIterator(iter(self._parent))


class RunningSumIterator(dl.DatasetIterator):
    def __init__(self, parent: dl.DatasetIterator) -> None:
        super().__init__(parent)
        self._total = 0

    def __next__(self) -> int:
        self._total += int(np.sum(next(self._parent)))
        return self._total

    def get_state(self) -> dict[str, Any]:
        return {"parent": self._parent.get_state(), "total": self._total}

    def set_state(self, state: dict[str, Any]) -> None:
        self._parent.set_state(state["parent"])
        self._total = state["total"]


def test_a_users_iter_dataset_is_generic_and_needs_no_parent():
    assert list(Squares(5)) == [0, 1, 4, 9, 16]
    assert isinstance(Squares(1), dl.IterDataset) and Squares(1).parents == ()


def test_chained_calls_run_after_a_users_dataset():
    ds = Squares(10).map(lambda x: x + 1).filter(lambda x: x % 2 == 0).batch(2)
    assert [b.tolist() for b in ds] == [[2, 10], [26, 50], [82]]


def test_chained_calls_after_a_users_dataset_restore_at_every_step():
    ds = (Squares(30).seed(4).random_map(lambda x, rng: x + int(rng.integers(100)))
          .flat_map(lambda x: [x] * (x % 3)).batch(4, drop_remainder=True))
    assert_restores_everywhere(lambda: iter(ds))


def test_random_maps_at_the_iterator_level_are_reproducible_and_seeded():
    ds = Squares(20).seed(1).random_map(lambda x, rng: rng.integers(1 << 30))
    assert list(ds) == list(ds)
    assert list(ds) != list(Squares(20).seed(2).random_map(lambda x, rng: rng.integers(1 << 30)))
    with pytest.raises(ValueError, match=r"needs a seed .* call \.seed\(\.\.\.\) earlier"):
        Squares(3).random_map(lambda x, rng: x)


def test_map_with_index_counts_the_elements_that_reach_it():
    ds = Squares(8).filter(lambda x: x % 2 == 0).map_with_index(lambda i, x: (i, x))
    assert list(ds) == [(0, 0), (1, 4), (2, 16), (3, 36)]


def test_a_map_given_a_flat_map_transform_flattens_as_in_grain():
    ds = Squares(4).map(dl.FlatMapTransform(lambda x: [x, -x]))
    assert list(ds) == [0, 0, 1, -1, 4, -4, 9, -9]


def test_a_users_transformation_over_an_engine_stream_restores_at_every_step():
    base = dl.MapDataset.range(40).seed(3).shuffle().map(lambda x: x * 2).batch(3).to_iter_dataset()
    assert_restores_everywhere(lambda: iter(RunningSum(base).batch(2)), limit=20)


def test_a_batch_error_at_the_iterator_level_names_the_batch():
    ds = Squares(4).map(lambda x: np.zeros(x)).batch(2)
    with pytest.raises(dl.PipelineError, match=r"Batch\(2, drop_remainder=False\) failed on a batch"):
        list(ds)


def test_a_map_error_at_the_iterator_level_names_the_operation_and_element():
    ds = Squares(5).map(lambda x: 1 // (x - 4))
    it = iter(ds)
    assert [next(it), next(it)] == [-1, -1]
    with pytest.raises(dl.PipelineError, match=r"MapTransform\(.*<lambda>\) failed on element 2 .*ZeroDivisionError"):
        next(it)


def test_thread_prefetch_keeps_the_output_and_the_state_of_what_was_handed_out():
    ds = RunningSum(Squares(50))
    prefetched = dl.experimental.ThreadPrefetchIterDataset(ds, prefetch_buffer_size=4)
    assert list(prefetched) == list(ds)
    assert_restores_everywhere(lambda: iter(prefetched), limit=30, fresh_iterator_every=2)


def test_thread_prefetch_hands_over_an_error_at_its_place():
    prefetched = dl.experimental.ThreadPrefetchIterDataset(
        Squares(6).map(lambda x: 10 // (x - 9)), prefetch_buffer_size=3)
    it = iter(prefetched)
    assert [next(it) for _ in range(3)] == [-2, -2, -2]
    with pytest.raises(dl.PipelineError, match="ZeroDivisionError"):
        next(it)
    it.close()


def test_thread_prefetch_of_zero_is_the_parent_itself_and_negative_is_refused():
    assert isinstance(iter(dl.experimental.ThreadPrefetchIterDataset(Squares(2), prefetch_buffer_size=0)),
                      SquaresIterator)
    with pytest.raises(ValueError, match=r"`prefetch_buffer_size` must be greater than or equal to 0, got -1"):
        dl.experimental.ThreadPrefetchIterDataset(Squares(2), prefetch_buffer_size=-1)


def _mp_pipeline(workers: int) -> dl.IterDataset:
    base = (dl.MapDataset.range(60).seed(9).shuffle().map(lambda x: np.full(2, x))
            .to_iter_dataset().filter(lambda x: x[0] % 5 != 0))
    return RunningSum(base).batch(3).mp_prefetch(dl.MultiprocessingOptions(num_workers=workers))


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_mp_prefetch_over_a_users_transformation_is_equal_for_0_1_and_2_workers():
    outputs = [list(_mp_pipeline(w)) for w in (0, 1, 2)]
    assert_streams_equal(outputs[0], outputs[1])
    assert_streams_equal(outputs[0], outputs[2])


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_mp_prefetch_over_a_users_transformation_restores_with_another_worker_count():
    it = iter(_mp_pipeline(2))
    first = [next(it) for _ in range(4)]
    state = it.get_state()
    rest = [next(it) for _ in range(3)]
    it.close()
    resumed = iter(_mp_pipeline(0))
    resumed.set_state(state)
    assert_streams_equal([next(resumed) for _ in range(3)], rest)
    assert first
    resumed.close()


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_mp_prefetch_gives_the_engine_part_worker_processes():
    it = iter(_mp_pipeline(2))
    next(it)
    engine = it._parent._parent._parent  # prefetch thread -> batch -> running sum -> loader
    assert isinstance(engine, dl.DataLoaderIterator) and len(engine._executor.pids) == 2
    it.close()


def test_a_sys_exit_in_an_iterator_level_map_arrives_as_an_error_at_its_element():
    import sys

    ds = Squares(5).map(lambda x: sys.exit(3) if x == 4 else x)
    it = iter(ds)
    assert [next(it), next(it)] == [0, 1]
    with pytest.raises(dl.PipelineError, match=r"failed on element 2 .*SystemExit: 3"):
        next(it)
