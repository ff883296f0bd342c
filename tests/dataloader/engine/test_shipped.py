"""Shipped units: a unit's elements written to a memfd and read back through
``/proc/<pid>/fd``, and the table a worker finds them by."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

from dataloader.engine.shipped_inputs import ShippedInputs, read_elements, write_elements
from dataloader.engine.stages.base import DatasetIterator
from dataloader.engine.stages.elementwise import ElementwiseIterator
from dataloader.engine.stages.shipped import ShippedElementwiseIterator
from dataloader.operations import FlatMapTransform, MapTransform, RandomMapTransform
from dataloader.options import MultiprocessingOptions


def test_elements_come_back_equal_and_writable():
    elements = [{"x": np.arange(i * 100, dtype=np.int32), "s": b"k%d" % i} for i in range(5)]
    fd, size = write_elements(elements)
    try:
        back = read_elements(f"/proc/{os.getpid()}/fd/{fd}")
    finally:
        os.close(fd)
    assert size % 64 == 0
    assert [e["s"] for e in back] == [e["s"] for e in elements]
    for a, b in zip(back, elements):
        np.testing.assert_array_equal(a["x"], b["x"])
    back[4]["x"][0] = -1  # copy on write: a map may change what it receives
    assert elements[4]["x"][0] == 0


def test_a_worker_copy_reads_units_from_the_table():
    inputs = ShippedInputs(4, shared=True)
    try:
        inputs.put(4, ["a", "b", "c", "d"])
        inputs.put(8, ["e"])
        worker = pickle.loads(pickle.dumps(inputs))  # what a worker unpickles
        assert worker.__getitems__(np.arange(5, 8)) == ["b", "c", "d"]
        assert worker.__getitems__(np.arange(8, 9)) == ["e"]
        assert inputs.__getitems__(np.arange(4, 6)) == ["a", "b"]
        inputs.drop(4)
        with pytest.raises(LookupError, match="position 5"):
            inputs.__getitems__(np.arange(5, 6))
    finally:
        inputs.close()


def test_units_kept_in_process_do_not_pickle():
    with pytest.raises(TypeError, match="stays in its process"):
        pickle.dumps(ShippedInputs(4, shared=False))


def test_a_worker_that_cannot_reach_the_parent_says_what_to_do():
    inputs = ShippedInputs(4, shared=True)
    try:
        inputs.put(0, ["a"])
        worker = pickle.loads(pickle.dumps(inputs))
        worker._pid = 2**22 + 7  # no such process: its /proc entry cannot be opened
        with pytest.raises(OSError, match=r"cannot open .*/proc/.*num_workers=0"):
            worker.__getitems__(np.arange(0, 1))
    finally:
        inputs.close()


class Numbers(DatasetIterator):
    def __init__(self, n):
        super().__init__()
        self._i, self._n = 0, n

    def __next__(self):
        if self._i >= self._n:
            raise StopIteration
        self._i += 1
        return self._i - 1

    def get_state(self):
        return {"i": self._i}

    def set_state(self, state):
        self._i = state["i"]


class Jitter(RandomMapTransform):
    def random_map(self, x, rng):
        return (x, int(rng.integers(1000)))


class Twice(FlatMapTransform):
    def flat_map(self, x):
        return [x] * (x % 3)


def test_it_stands_in_for_the_element_by_element_stage_with_a_loaders_seed():
    ops = (Twice(), Jitter(), MapTransform(lambda t: t[0] * 1000 + t[1]))
    expected = list(ElementwiseIterator(Numbers(150), ops, default_seed=5))
    shipped = ShippedElementwiseIterator(Numbers(150), ops, MultiprocessingOptions(num_workers=0), default_seed=5)
    assert list(shipped) == expected
    other_seed = ShippedElementwiseIterator(Numbers(150), ops, MultiprocessingOptions(num_workers=0), default_seed=6)
    assert list(other_seed) != expected
