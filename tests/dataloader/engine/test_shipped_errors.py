"""After an error, the shipped stage goes on as the element-by-element stage does.

An error in an operation comes at its element's place and the next ``next()`` goes on
with the element after it; an error of the iterated stage itself is followed by what
that stage gives next. The states on the way are the element-by-element stage's, for
every worker count.
"""

from __future__ import annotations

import json

import pytest

from dataloader.engine.stages.base import DatasetIterator
from dataloader.engine.stages.elementwise import ElementwiseIterator
from dataloader.engine.stages.shipped import ShippedElementwiseIterator
from dataloader.errors import PipelineError
from dataloader.operations import FilterTransform, FlatMapTransform, MapTransform
from dataloader.options import MultiprocessingOptions
from tests.integration.conftest import no_leaks  # noqa: F401  (autouse: no child or block left)

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(180)]

# Elements whose map fails: inside a unit, at a unit's first and last element (units of
# 64), and two in a row.
FAILING = {5, 63, 64, 127, 128, 129, 200}


class Numbers(DatasetIterator):
    """0, 1, ... n - 1; raises KeyError instead of the elements in ``gaps`` (and goes on)."""

    def __init__(self, n, gaps=()):
        super().__init__()
        self._i, self._n, self._gaps = 0, n, set(gaps)

    def __next__(self):
        if self._i >= self._n:
            raise StopIteration
        self._i += 1
        if self._i - 1 in self._gaps:
            raise KeyError(f"element {self._i - 1} is gone")
        return self._i - 1

    def get_state(self):
        return {"i": self._i}

    def set_state(self, state):
        self._i = state["i"]


def fail_some(x):
    if x in FAILING:
        raise ValueError(f"element {x}")
    return x * 10


def odd_out(x):
    return x % 7 != 3


class Twice(FlatMapTransform):
    def flat_map(self, x):
        return [x, x + 1000] if x % 5 == 0 else [x]


def trace(it, limit=1000):
    """What each next() gave (an output or an error's type and position), and the
    state after it, to the end."""
    out = []
    for _ in range(limit):
        try:
            got = ("out", next(it))
        except StopIteration:
            break
        except (PipelineError, KeyError) as exc:
            got = ("error", type(exc).__name__, getattr(exc, "position", None))
        out.append((got, json.dumps(it.get_state())))
    it.close()
    return out


def make(ops, workers, gaps=()):
    if workers is None:
        return ElementwiseIterator(Numbers(300, gaps), ops, default_seed=3)
    options = MultiprocessingOptions(num_workers=workers)
    return ShippedElementwiseIterator(Numbers(300, gaps), ops, options, default_seed=3)


CASES = {
    "map": ((MapTransform(fail_some),), ()),
    "filter, flat map, map": ((FilterTransform(odd_out), Twice(), MapTransform(fail_some)), ()),
    "the iterated stage fails": ((MapTransform(odd_out),), (0, 64, 100, 101, 170, 299)),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("workers", [0, 1, 2, "auto"])
def test_after_an_error_the_stream_goes_on_as_element_by_element(case, workers):
    ops, gaps = CASES[case]
    expected = trace(make(ops, None, gaps))
    errors = [got for got, _ in expected if got[0] == "error"]
    assert len(errors) >= 5  # (129 is filtered out before the map)
    assert trace(make(ops, workers, gaps)) == expected


@pytest.mark.parametrize("workers", [0, 2])
def test_a_state_taken_right_after_an_error_restores_to_the_element_after_it(workers):
    ops = (MapTransform(fail_some),)
    it = make(ops, workers)
    for _ in range(70):  # 5, 63 and 64 fail among them
        try:
            next(it)
        except PipelineError:
            state = it.get_state()
    it.close()
    assert state["index"] == 65
    restored = make(ops, workers)
    restored.set_state(state)
    assert [next(restored) for _ in range(3)] == [650, 660, 670]
    restored.close()
