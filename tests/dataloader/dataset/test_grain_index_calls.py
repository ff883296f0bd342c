"""Grain's meaning of the index a ``map_with_index`` or ``flat_map`` gets, the names Grain
gives those calls, and the checks Grain makes at construction.

Grain reads a ``MapDataset`` at any index: past one pass the parent's later epochs, and
after ``repeat()`` for ever. ``map_with_index`` receives that index whole (Grain's tests
build their packing inputs as ``range(1, 8).repeat().map_with_index(f)[:n]``).
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

import dataloader as dl
from tests.helpers import assert_restores_everywhere


def tagged(index, value):
    return (index, value)


def test_map_with_index_after_repeat_counts_through_the_epochs():
    ds = dl.MapDataset.range(1, 8).repeat().map_with_index(tagged)
    assert len(ds) == sys.maxsize
    expected = [(i, 1 + i % 7) for i in range(20)]
    assert [ds[i] for i in range(20)] == expected
    assert ds.__getitems__(list(range(20))) == expected
    assert ds[10**12] == (10**12, 1 + 10**12 % 7)
    assert list(ds[:9]) == expected[:9]
    assert list(ds[:9].to_iter_dataset()) == expected[:9]


def test_map_with_index_read_past_its_length_gets_the_index_unreduced():
    ds = dl.MapDataset.range(3, 6).map_with_index(tagged)
    assert [ds[i] for i in range(6)] == [(0, 3), (1, 4), (2, 5), (3, 3), (4, 4), (5, 5)]
    assert list(ds.repeat(2)) == [(0, 3), (1, 4), (2, 5), (3, 3), (4, 4), (5, 5)]


def test_map_with_index_below_a_shuffle_sees_the_shuffles_next_epoch():
    parent = dl.MapDataset.range(6).seed(4).shuffle()
    ds = parent.map_with_index(tagged)
    assert [ds[i] for i in range(12)] == [(i, parent[i]) for i in range(12)]
    assert sorted(parent[i] for i in range(6, 12)) == list(range(6))  # a permutation again


def test_map_with_index_inside_a_concatenation_and_a_mixture_keeps_its_epochs():
    indexed = dl.MapDataset.range(10, 13).map_with_index(tagged)
    both = dl.MapDataset.concatenate([dl.MapDataset.range(2), indexed])
    assert [both[i] for i in range(10)] == [0, 1, (0, 10), (1, 11), (2, 12), 0, 1, (3, 10), (4, 11), (5, 12)]
    endless = dl.MapDataset.range(100, 102).repeat().map_with_index(tagged)
    mixed = dl.MapDataset.mix([endless, dl.MapDataset.range(5)], [1, 1])
    assert [mixed[i] for i in range(8)] == [(0, 100), 0, (1, 101), 1, (2, 100), 2, (3, 101), 3]


def test_an_endless_map_with_index_stream_restores_at_every_step():
    ds = dl.MapDataset.range(5).seed(2).shuffle().repeat().map_with_index(tagged).to_iter_dataset()
    out = assert_restores_everywhere(lambda: iter(ds), limit=23)
    assert [i for i, _ in out] == list(range(23))


def test_concat_then_split_packs_an_endless_indexed_input():
    """Grain's tests' input: observation ``[v] * v`` with its index, cut into rows of 6."""
    ds = dl.MapDataset.range(1, 8).repeat().map_with_index(
        lambda i, v: {"observation": np.repeat(v, v), "index": i + 1})[:9]
    packed = dl.experimental.ConcatThenSplitIterDataset(
        ds.to_iter_dataset(), length_struct={"observation": 6, "index": 6}, meta_features={"index"},
        split_full_length_features=True)
    rows = list(packed)
    tokens = np.concatenate([r["observation"][r["observation_segment_ids"] > 0] for r in rows])
    assert tokens.tolist() == [v for v in [1, 2, 3, 4, 5, 6, 7, 1, 2] for _ in range(v)][: len(tokens)]
    assert rows[0]["index"].tolist()[:3] == [1, 2, 3]


def test_flat_map_on_an_endless_dataset_reads_the_parents_later_epochs():
    twice = dl.FlatMapTransform(lambda x: [x, -x] if x % 2 else [x], max_fan_out=2)
    ds = dl.MapDataset.range(3).seed(1).shuffle().repeat().flat_map(twice)
    parent = dl.MapDataset.range(3).seed(1).shuffle().repeat()
    assert len(ds) == sys.maxsize
    for k in range(14):
        outputs = [parent[k // 2]] + ([-parent[k // 2]] if parent[k // 2] % 2 else [])
        assert ds[k] == (outputs[k % 2] if k % 2 < len(outputs) else None)
    finite = dl.MapDataset.range(3).seed(1).shuffle().flat_map(twice)
    assert [finite[k] for k in range(6, 12)] == [ds[k] for k in range(6, 12)]  # its second epoch


def test_grains_flat_map_class_names_build_what_the_method_builds():
    twice = dl.FlatMapTransform(lambda x: [x, x + 100], max_fan_out=2)
    base = dl.MapDataset.range(4)
    by_name = dl.experimental.FlatMapMapDataset(base, twice)
    assert len(by_name) == 8
    assert list(by_name) == list(base.flat_map(twice)) == [0, 100, 1, 101, 2, 102, 3, 103]
    stream = dl.experimental.FlatMapIterDataset(base.to_iter_dataset(), twice)
    assert list(stream) == [0, 100, 1, 101, 2, 102, 3, 103]
    with pytest.raises(TypeError, match=r"FlatMapMapDataset needs a MapDataset .* use FlatMapIterDataset"):
        dl.experimental.FlatMapMapDataset(base.to_iter_dataset(), twice)
    with pytest.raises(TypeError, match=r"FlatMapIterDataset needs a FlatMapTransform .* got <function"):
        dl.experimental.FlatMapIterDataset(base.to_iter_dataset(), lambda x: [x])


def test_a_mixture_refuses_an_empty_dataset_at_construction():
    empty = dl.MapDataset.range(0)
    with pytest.raises(ValueError, match=r"MapDataset\.mix: datasets 0 \(.*\), 2 \(.*\) have length 0; .* Leave the"):
        dl.MapDataset.mix([empty, dl.MapDataset.range(3), empty])
    with pytest.raises(ValueError, match=r"MapDataset\.mix: dataset 1 \(.*\) has length 0"):
        dl.MapDataset.mix([dl.MapDataset.range(3), empty], [1.0, 0.0])


def test_multithread_prefetch_takes_grains_sequential_slice():
    ds = dl.MapDataset.range(10).to_iter_dataset()
    assert list(dl.experimental.multithread_prefetch(ds, num_threads=2, buffer_size=1, sequential_slice=True)) \
        == list(range(10))
    with pytest.raises(TypeError, match="sequential_slice must be True or False, got 'yes'"):
        dl.experimental.multithread_prefetch(ds, num_threads=2, buffer_size=1, sequential_slice="yes")


@pytest.mark.multiprocess
def test_an_endless_map_with_index_runs_the_same_on_workers():
    ds = dl.MapDataset.range(7).seed(3).shuffle().repeat().map_with_index(tagged)[:40].to_iter_dataset()
    alone = list(ds)
    on_workers = ds.mp_prefetch(dl.MultiprocessingOptions(num_workers=2))
    assert list(on_workers) == alone
    assert [i for i, _ in alone] == list(range(40))
