"""assert_equal_output_after_checkpoint: passes on exact pipelines, fails on broken ones."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import dataloader as dl
from dataloader.experimental import assert_equal_output_after_checkpoint


class Source(dl.IterDataset):
    """0..n-1 from a user's iterator whose restore can be broken on purpose."""

    def __init__(self, n: int, off_by: int = 0, state: Any = None) -> None:
        super().__init__()
        self.n, self.off_by, self.state = n, off_by, state

    def __iter__(self) -> SourceIterator:
        return SourceIterator(self)


class SourceIterator(dl.DatasetIterator):
    def __init__(self, ds: Source) -> None:
        super().__init__()
        self._ds, self._i = ds, 0

    def __next__(self) -> int:
        if self._i >= self._ds.n:
            raise StopIteration
        self._i += 1
        return self._i - 1

    def get_state(self) -> dict[str, Any]:
        return {"i": self._i, **({"extra": self._ds.state} if self._ds.state is not None else {})}

    def set_state(self, state: dict[str, Any]) -> None:
        self._i = state["i"] + self._ds.off_by


def test_it_passes_on_exact_pipelines():
    assert_equal_output_after_checkpoint(Source(6))
    assert_equal_output_after_checkpoint(
        dl.MapDataset.range(20).seed(1).shuffle().map(lambda x: {"x": np.full(3, x)}).to_iter_dataset()
        .filter(lambda e: e["x"][0] % 3).batch(4))
    assert_equal_output_after_checkpoint(dl.experimental.LimitIterDataset(
        dl.IterDataset.mix([Source(30), dl.MapDataset.range(100).to_iter_dataset()], [1, 2]), 20))


def test_it_fails_when_a_restore_lands_elsewhere():
    with pytest.raises(AssertionError, match=r"state after set_state differs from the one restored at step 0"):
        assert_equal_output_after_checkpoint(Source(4, off_by=1))


def test_it_fails_on_an_empty_dataset_and_on_states_that_are_not_json():
    with pytest.raises(AssertionError, match="the dataset produced no elements"):
        assert_equal_output_after_checkpoint(Source(0))
    with pytest.raises(AssertionError, match=r"the state before step 0 is not JSON-serialisable"):
        assert_equal_output_after_checkpoint(Source(2, state=object()))


class ForgetfulIterator(SourceIterator):
    """Restores its position but not the offset a real iterator would keep in its state."""

    offset = 100

    def __next__(self) -> int:
        return super().__next__() + self.offset

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        self.offset = 0


class Forgetful(Source):
    def __iter__(self) -> ForgetfulIterator:
        return ForgetfulIterator(self)


def test_it_names_the_step_where_the_output_differs():
    with pytest.raises(AssertionError, match=r"output restored at step 0 differs"):
        assert_equal_output_after_checkpoint(Forgetful(5))
