"""PackAndBatchOperation: Grain's first-fit pack-and-batch, checked against a direct
implementation of Grain's algorithm on random streams, and the arguments it refuses."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dataloader.operations.packing import PackAndBatchOperation
from tests.operations.test_packing import fit_pack as pack  # the stage's round-by-round loop


def grains_algorithm(seqs, batch_size, length, max_per_row=None):
    """Grain's example_packing loop, written out plainly: (data, segmentations, positions)."""
    def empty():
        return np.zeros((batch_size, length), np.int64), np.zeros((batch_size, length), np.int32), \
            np.zeros((batch_size, length), np.int32), [0] * batch_size, [0] * batch_size

    out, (data, seg, pos, used, count) = [], empty()
    for seq in seqs:
        row = next((r for r in range(batch_size) if used[r] + len(seq) <= length
                    and (max_per_row is None or count[r] < max_per_row)), None)
        if row is None:
            out.append((data, seg, pos))
            data, seg, pos, used, count = empty()
            row = 0
        start, stop = used[row], used[row] + len(seq)
        data[row, start:stop], seg[row, start:stop] = seq, count[row] + 1
        pos[row, start:stop] = np.arange(len(seq))
        used[row], count[row] = stop, count[row] + 1
    return [*out, (data, seg, pos)]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(1, 16), min_size=1, max_size=50), st.integers(1, 5),
       st.one_of(st.none(), st.integers(1, 3)))
def test_batches_are_grains_for_sequences_that_fit_a_row(lengths, batch_size, max_per_row):
    seqs = [np.arange(n, dtype=np.int64) + 100 * k + 1 for k, n in enumerate(lengths)]
    ours = pack(PackAndBatchOperation({"t": 16}, batch_size, max_sequences_per_bin=max_per_row), seqs)
    theirs = grains_algorithm(seqs, batch_size, 16, max_per_row)
    assert len(ours) == len(theirs)
    for (data, seg, pos), (d, s, p) in zip(ours, theirs):
        assert data["t"].tolist() == d.tolist()
        assert seg["t"].tolist() == s.tolist() and pos["t"].tolist() == p.tolist()
        assert data["t"].shape == (batch_size, 16) and seg["t"].dtype == np.int32


def test_every_feature_of_length_struct_is_packed_with_its_own_length():
    op = PackAndBatchOperation({"inputs": 4, "targets": 3}, batch_size=2)
    packing = op.new_round()
    for i, t in ([1, 2], [7]), ([3], [8, 9]), ([4, 5, 6], [10]):
        assert packing.add({"inputs": np.array(i), "targets": np.array(t)})
    (data, seg, pos), = packing.rows()
    assert data["inputs"].tolist() == [[1, 2, 3, 0], [4, 5, 6, 0]]
    assert data["targets"].tolist() == [[7, 8, 9], [10, 0, 0]]
    assert seg["targets"].tolist() == [[1, 2, 2], [1, 0, 0]]
    assert pos["inputs"].tolist() == [[0, 1, 0, 0], [0, 1, 2, 0]]


def test_a_sequence_longer_than_its_row_is_cut_into_pieces():
    op = PackAndBatchOperation({"t": 4}, batch_size=2)
    (data, seg, _), = pack(op, [np.arange(1, 7)])
    assert data["t"].tolist() == [[1, 2, 3, 4], [5, 6, 0, 0]]
    assert seg["t"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]


def test_an_empty_round_gives_no_batch():
    assert PackAndBatchOperation({"t": 4}, batch_size=2).new_round().rows() == []


@pytest.mark.parametrize("batch_size", [0, -3, 2.0])
def test_a_batch_size_that_is_not_positive_is_refused(batch_size):
    with pytest.raises(ValueError, match=rf"PackAndBatchOperation batch_size must be a positive integer, got {batch_size!r}"):
        PackAndBatchOperation({"t": 4}, batch_size)


def test_a_bad_length_struct_or_bin_limit_is_refused():
    with pytest.raises(TypeError, match=r"length_struct must be a non-empty dict"):
        PackAndBatchOperation([4], 2)
    with pytest.raises(ValueError, match=r"max_sequences_per_bin must be a positive integer, got 0"):
        PackAndBatchOperation({"t": 4}, 2, max_sequences_per_bin=0)
