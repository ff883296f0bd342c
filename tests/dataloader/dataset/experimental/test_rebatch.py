"""RebatchIterDataset: Grain's re-cutting of batches, without unbatching; restores; bad input."""

from __future__ import annotations

import collections

import numpy as np
import pytest

import dataloader as dl
from dataloader.experimental import RebatchIterDataset
from tests.dataloader.dataset.experimental.streams import Counted
from tests.helpers import assert_restores_everywhere


def tree(x):
    """Grain's test element: three features of shape (2,)."""
    return {f"key_{i}": np.full(2, x) for i in range(3)}


def rebatched(batch_size, rebatch_size, drop_remainder=False, n=10):
    ds = dl.MapDataset.range(n).map(tree).to_iter_dataset().batch(batch_size)
    return RebatchIterDataset(ds, batch_size=rebatch_size, drop_remainder=drop_remainder)


@pytest.mark.parametrize(("batch_size", "rebatch_size"), [(2, 4), (4, 2), (3, 3), (3, 4), (4, 3), (1, 7), (10, 1)])
def test_rebatching_cuts_the_same_rows_into_batches_of_the_new_size(batch_size, rebatch_size):
    """Grain's to_larger/to_smaller/to_same/uneven cases: row order kept, the last batch short."""
    out = list(rebatched(batch_size, rebatch_size))
    sizes = [len(b["key_0"]) for b in out]
    assert sizes == [rebatch_size] * (10 // rebatch_size) + ([10 % rebatch_size] if 10 % rebatch_size else [])
    for key in ("key_0", "key_1", "key_2"):
        rows = np.concatenate([b[key] for b in out])
        np.testing.assert_array_equal(rows, np.repeat(np.arange(10), 2).reshape(10, 2))


def test_drop_remainder_drops_the_short_last_batch():
    out = list(rebatched(3, 4, drop_remainder=True))
    assert [b["key_0"][:, 0].tolist() for b in out] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_a_batch_cut_from_one_parent_batch_is_a_view_not_a_copy():
    parent = [np.arange(6), np.arange(6, 12)]
    out = list(RebatchIterDataset(Counted(parent), 3))
    assert [b.tolist() for b in out] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]
    assert all(np.shares_memory(b, parent[i // 2]) for i, b in enumerate(out))


def test_tuples_named_tuples_and_lists_keep_their_structure():
    Pair = collections.namedtuple("Pair", "a b")
    parent = [Pair(np.arange(2), [np.zeros((2, 3)), np.ones(2)]), Pair(np.arange(2, 5), [np.zeros((3, 3)), np.ones(3)])]
    out = list(RebatchIterDataset(Counted(parent), 4))
    assert isinstance(out[0], Pair) and isinstance(out[0].b, list)
    assert out[0].a.tolist() == [0, 1, 2, 3] and out[0].b[0].shape == (4, 3) and out[1].a.tolist() == [4]


def test_empty_parent_batches_are_passed_over():
    out = list(RebatchIterDataset(Counted([np.arange(2), np.arange(0), np.arange(2, 5)]), 2))
    assert [b.tolist() for b in out] == [[0, 1], [2, 3], [4]]


@pytest.mark.parametrize(("batch_size", "rebatch_size", "drop"), [(3, 4, False), (4, 3, True), (2, 5, False)])
def test_rebatch_restores_at_every_step(batch_size, rebatch_size, drop):
    ds = dl.MapDataset.range(23).seed(1).shuffle().map(tree).to_iter_dataset().batch(batch_size)
    assert_restores_everywhere(lambda: iter(RebatchIterDataset(ds, rebatch_size, drop_remainder=drop)))


def test_a_restore_reads_one_parent_batch_again_not_the_stream():
    source = Counted([np.arange(i * 5, i * 5 + 5) for i in range(20)])
    it = iter(RebatchIterDataset(source, 3))
    for _ in range(21):  # 63 rows: the state is before parent batch 12 (rows 60-64), offset 3
        next(it)
    state = it.get_state()
    source.reads[0] = 0
    restored = iter(RebatchIterDataset(source, 3))
    restored.set_state(state)
    assert next(restored).tolist() == [63, 64, 65]
    assert source.reads[0] == 2  # parent batch 12 again, then batch 13 (which it needs anyway)
    assert next(it).tolist() == [63, 64, 65]


def test_rebatch_refuses_bad_arguments():
    ds = dl.MapDataset.range(4).batch(2).to_iter_dataset()
    with pytest.raises(ValueError, match=r"batch_size must be a positive integer, got 0"):
        RebatchIterDataset(ds, 0)
    with pytest.raises(TypeError, match=r"drop_remainder must be True or False, got 1"):
        RebatchIterDataset(ds, 2, drop_remainder=1)


def test_rebatch_names_batches_it_cannot_cut():
    with pytest.raises(dl.PipelineError, match=r"do not share one leading .* dimension"):
        list(RebatchIterDataset(Counted([{"a": np.zeros(2), "b": np.zeros(3)}]), 2))
    with pytest.raises(dl.PipelineError, match=r"structure differs from the first batch's"):
        list(RebatchIterDataset(Counted([{"a": np.zeros(2)}, {"b": np.zeros(2)}]), 3))
    with pytest.raises(dl.PipelineError, match=r"leading \(batch\) dimension"):
        list(RebatchIterDataset(Counted([np.float32(1.0)]), 3))
