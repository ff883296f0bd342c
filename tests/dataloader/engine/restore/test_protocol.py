"""The elastic-restore protocol: declared by every stage, checked once, refusals by name.

A stage of one's own over a loader takes part by answering ``ElasticStage`` (the example
of docs/elastic-protocol.md); one that does not is refused, naming it, before anything
moves; every old state is taken apart once, by each stage.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import pytest

import dataloader as dl
from dataloader.dataset.transformations.window_shuffle import WindowShuffleDatasetIterator
from dataloader.engine.restore.protocol import (
    ElasticHead,
    ElasticStage,
    StatePart,
    chain_of,
    takes_every_host,
)
from dataloader.engine.restore.saved import LoaderState, OldHosts
from tests.dataloader.engine.elastic_cases import (
    DATASETS,
    PIPELINES,
    make_dataset_iterator,
    make_loader,
)

N = 103


def _old_states(make: Callable[[int, int], Any], count: int = 2, steps: int = 2) -> list[Any]:
    its = [make(h, count) for h in range(count)]
    for it in its:
        for _ in range(steps):
            next(it)
    states = [json.loads(json.dumps(it.get_state())) for it in its]
    for it in its:
        it.close()
    return states


@pytest.mark.parametrize("name", [*PIPELINES, *DATASETS])
def test_every_stage_of_the_elastic_tables_declares_the_protocol(name):
    it = make_dataset_iterator(name, 0, 2) if name in DATASETS else iter(make_loader(name, 0, 2))
    try:
        chain = chain_of(it)
        assert isinstance(chain[-1], ElasticHead)
        assert all(isinstance(stage, ElasticStage) for stage in chain[:-1])
        assert takes_every_host(it)
    finally:
        it.close()


class Twice(dl.DatasetIterator):
    """A stage of one's own: every element twice. It holds the second copy between two
    ``next()`` calls, so its state says so (``"pending"``)."""

    def __init__(self, parent: Any) -> None:
        super().__init__(parent)
        self._pending: Any = None
        self._before: Any = None

    def __next__(self) -> Any:
        if self._pending is not None:
            out, self._pending = self._pending, None
            return out
        self._before = self._parent.get_state()
        self._pending = next(self._parent)
        return self._pending

    def get_state(self) -> dict[str, Any]:
        if self._pending is not None:  # one copy out: from before the element, one to skip
            return {"parent": self._before, "skip": 1}
        return {"parent": self._parent.get_state(), "skip": 0}

    def set_state(self, state: dict[str, Any]) -> None:
        self._parent.set_state(state["parent"])
        self._pending = None
        if state["skip"]:
            self._before = state["parent"]
            self._pending = next(self._parent)


class ElasticTwice(Twice):
    """The same stage, taking part in an elastic restore (docs/elastic-protocol.md)."""

    @property
    def elastic_parent(self) -> Any:
        return self._parent

    def split_state(self, state: Any) -> StatePart:
        # Between the two copies it holds an element whose first copy went out: an elastic
        # restore would hand the element to another host again (or lose the copy).
        if state["skip"]:
            raise dl.StateMismatchError("Twice holds the second copy of an element; save between elements")
        return StatePart(state["parent"])

    def last_tag(self) -> Any:
        return None  # two outputs per element: a packer over it cannot name them

    def restart_elastic(self, resume: Callable[[], None], kept: Sequence[Any]) -> None:
        resume()
        self._pending = None


def _twice(cls: type, name: str = "flat map, unbatched") -> Callable[[int, int], Any]:
    return lambda h, c: cls(make_loader(name, h, c).iterator())


def test_a_stage_of_ones_own_without_the_protocol_is_refused_by_name_and_nothing_moves():
    states = _old_states(_twice(Twice))
    it = _twice(Twice)(0, 3)
    first = [next(it) for _ in range(3)]
    with pytest.raises(dl.StateMismatchError, match=r"cannot run through .*\(Twice\): it restores from one state only"):
        it.set_state(states)
    rest = list(it)
    again = _twice(Twice)(0, 3)
    assert first + rest == list(again)  # the stream went on as if nothing was asked


def test_a_stage_of_ones_own_with_the_protocol_restores_every_record_once():
    states = _old_states(_twice(ElasticTwice), steps=4)  # an even count: between elements
    used = [x for s in range(2) for x in list(_twice(ElasticTwice)(s, 2))[:4]]
    for h in range(3):
        it = _twice(ElasticTwice)(h, 3)
        it.set_state(states)
        used += list(it)
    whole = list(_twice(ElasticTwice)(0, 1))
    assert sorted(used) == sorted(whole)


def test_a_state_a_stage_cannot_take_apart_is_refused_before_anything_moves():
    states = _old_states(_twice(ElasticTwice), steps=3)  # an odd count: inside an element
    it = _twice(ElasticTwice)(0, 3)
    first = next(it)
    with pytest.raises(dl.StateMismatchError, match="holds the second copy"):
        it.set_state(states)
    assert [first, *it] == list(_twice(ElasticTwice)(0, 3))


def test_each_old_state_is_taken_apart_once_by_each_stage():
    calls = []

    class Counting(WindowShuffleDatasetIterator):
        def split_state(self, state: Any) -> StatePart:
            calls.append(state["window_index"])
            return super().split_state(state)

    def make(h, c):
        return Counting(make_loader("flat map, unbatched", h, c).iterator(), 5, 3)

    states = _old_states(make)
    make(0, 3).set_state(states)
    assert len(calls) == len(states)


def test_the_typed_values_check_each_field_once_at_the_door():
    states = _old_states(lambda h, c: iter(make_loader("filter", h, c)))
    head = LoaderState.parse(json.dumps(states[0]))
    assert head.cursor.position == states[0]["position"] and head.fingerprint is not None
    bad = dict(states[0], position=-1)
    with pytest.raises(dl.StateMismatchError, match=r"state field position=-1 is invalid"):
        LoaderState.parse(bad)
    chain = chain_of(iter(make_loader("filter", 0, 3)))
    hosts = OldHosts.parse(chain, states)
    assert hosts.count == 2 and [h.shard for h in hosts.by_shard()] == [0, 1]
    with pytest.raises(dl.StateMismatchError, match=r"expected a state dict from get_state\(\), got list"):
        OldHosts.parse(chain, [states[0], 3])
