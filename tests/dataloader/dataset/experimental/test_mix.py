"""IterDataset.mix: dicts of named datasets, and the iterator-level mixture of streams the
engine cannot compile (Grain's semantics, exact proportions of outputs, restores)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import dataloader as dl
from dataloader.dataset.iter_dataset import LoaderIterDataset
from tests.dataloader.dataset.experimental.streams import Counted, engine_stream
from tests.helpers import assert_restores_everywhere


def ranges():
    return dl.MapDataset.range(5).to_iter_dataset(), dl.MapDataset.range(7, 10).to_iter_dataset()


def test_mix_stops_at_the_first_exhausted_component_as_in_grain():
    a, b = ranges()
    assert list(dl.IterDataset.mix([a, b])) == [0, 7, 1, 8, 2, 9, 3]
    assert list(dl.IterDataset.mix([Counted([0, 1, 2, 3, 4]), b])) == [0, 7, 1, 8, 2, 9, 3]


def test_a_dict_of_named_datasets_mixes_their_elements():
    a, b = ranges()
    assert list(dl.IterDataset.mix({"b": b, "a": a})) == [0, 7, 1, 8, 2, 9, 3]
    out = list(dl.IterDataset.mix({"a": a, "b": b}, weights={"a": 1, "b": 3}))
    assert out == [0, 7, 8, 9, 1]  # grain 0.2.18 gives the same


def test_engine_backed_lists_still_compile_to_one_engine():
    a, b = ranges()
    assert isinstance(dl.IterDataset.mix([a, b]), LoaderIterDataset)
    assert not isinstance(dl.IterDataset.mix({"a": a, "b": b}), LoaderIterDataset)
    assert not isinstance(dl.IterDataset.mix([a, Counted([1])]), LoaderIterDataset)


def test_proportions_are_exact_over_the_outputs_of_every_period():
    evens = Counted([0] * 400)
    ones = dl.MapDataset.range(1).repeat().map(lambda x: 1).to_iter_dataset().filter(lambda x: x == 1)
    mixed = dl.IterDataset.mix([evens, ones], weights=[0.3, 0.7])  # Grain's 100:233
    comp = np.asarray([x for _, x in zip(range(1200), mixed)])
    windows = np.lib.stride_tricks.sliding_window_view(comp, 333)
    assert set(windows.sum(axis=1).tolist()) == {233}


def test_a_packed_stream_mixes_with_an_engine_stream_and_restores_everywhere():
    tokens = dl.MapDataset.range(60).map(lambda x: {"tokens": np.arange(x % 5 + 1)}).to_iter_dataset()
    packed = dl.experimental.ConcatThenSplitIterDataset(tokens, length_struct={"tokens": 4})
    plain = dl.MapDataset.range(100).seed(3).shuffle().map(lambda x: {
        "tokens": np.full(4, x), "tokens_segment_ids": np.ones(4, np.int32),
        "tokens_positions": np.arange(4, dtype=np.int32)}).to_iter_dataset()
    mixed = dl.IterDataset.mix([packed, plain], weights=[2, 1]).batch(3)
    outputs = assert_restores_everywhere(lambda: iter(mixed), limit=30)
    assert len(outputs) == 23  # 180 tokens make 45 packed rows; 2:1 adds 22 plain ones: 67 rows


def test_a_dict_mixture_restores_at_every_step():
    mixed = dl.IterDataset.mix({"x": engine_stream(60), "y": Counted([{"x": np.int64(-i)} for i in range(80)])},
                               weights={"x": 0.25, "y": 0.75})
    assert_restores_everywhere(lambda: iter(mixed), limit=50)


def test_a_dict_state_restores_with_other_weights_and_components():
    a, b = ranges()
    it = iter(dl.IterDataset.mix({"a": a, "b": b}))
    assert [next(it) for _ in range(4)] == [0, 7, 1, 8]
    state = json.loads(json.dumps(it.get_state()))
    assert state["position"] == 4 and sorted(state["parents"]) == ["a", "b"]
    c = dl.MapDataset.range(100, 104).to_iter_dataset()
    grown = iter(dl.IterDataset.mix({"a": a, "b": b, "c": c}, weights={"a": 1, "b": 1, "c": 1}))
    grown.set_state(state)
    rest = list(grown)
    assert rest[:3] and set(rest) <= {2, 3, 4, 9, 100, 101, 102, 103}
    assert [x for x in rest if x >= 100] == [100, 101, 102, 103][: len([x for x in rest if x >= 100])]
    assert [x for x in rest if x < 7] == [2, 3, 4][: len([x for x in rest if x < 7])]  # a continues
    shrunk = iter(dl.IterDataset.mix({"a": a}))
    shrunk.set_state(state)
    assert list(shrunk) == [2, 3, 4]


def test_a_list_state_refuses_a_mixture_of_another_size():
    it = iter(dl.IterDataset.mix([Counted([1, 2]), Counted([3])]))
    next(it)
    state = it.get_state()
    other = iter(dl.IterDataset.mix([Counted([1, 2]), Counted([3]), Counted([4])]))
    with pytest.raises(dl.StateMismatchError, match=r"holds 2 component states but the mixture has 3"):
        other.set_state(state)


def test_mix_checks_its_arguments():
    a, b = ranges()
    with pytest.raises(ValueError, match=r"weights as a dict with the same keys \['a', 'b'\], got \['a', 'c'\]"):
        dl.IterDataset.mix({"a": a, "b": b}, weights={"a": 1, "c": 2})
    with pytest.raises(ValueError, match=r"got weights as a dict \(\['a', 'b'\]\) for a list of datasets"):
        dl.IterDataset.mix([a, b], weights={"a": 1, "b": 2})
    with pytest.raises(ValueError, match=r"weights as a dict with the same keys .* got \[1, 2\]"):
        dl.IterDataset.mix({"a": a, "b": b}, weights=[1, 2])
    with pytest.raises(TypeError, match=r"dict keys must be names \(str\), got 1"):
        dl.IterDataset.mix({1: a})
    with pytest.raises(TypeError, match=r"IterDataset.mix datasets\[1\] reads an IterDataset .* got 5"):
        dl.IterDataset.mix([a, 5])
    with pytest.raises(ValueError, match=r"weights\[1\] is -1"):
        dl.IterDataset.mix([a, Counted([1])], weights=[1, -1])
    with pytest.raises(ValueError, match="at least one dataset"):
        dl.IterDataset.mix([])


def test_an_iterator_level_mixture_with_a_long_period_draws_in_grains_order():
    """Weights 1 and 1e-4 are Grain's proportions [1000000, 100]: no table is laid out."""
    small = Counted(list(range(-20, 0)))
    big = dl.MapDataset.range(10**6).to_iter_dataset()
    it = iter(dl.IterDataset.mix([big, small], weights=[1, 1e-4]))
    out = [next(it) for _ in range(30000)]
    where = [i for i, x in enumerate(out) if x < 0]
    assert where == [10000, 20001]  # what grain 0.2.18 gives for the same mixture
