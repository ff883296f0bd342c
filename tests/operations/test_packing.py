"""Packers: properties on random streams (Hypothesis), and the arguments they refuse."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dataloader.operations.packing import (
    BestFitPack,
    BOSHandling,
    ConcatThenSplit,
    FirstFitPack,
)

lengths = st.lists(st.integers(min_value=1, max_value=30), min_size=1, max_size=60)


def sequences(lengths_: list[int]) -> list[np.ndarray]:
    """Sequence k holds k * 1000 + 0, 1, 2, ...: every token says where it came from."""
    return [np.arange(n, dtype=np.int64) + k * 1000 + 1 for k, n in enumerate(lengths_)]


def fit_pack(op, seqs):
    """All rows of a stream through a fit packer, round by round (as the stage drives it)."""
    rows, packing = [], op.new_round()
    for seq in seqs:
        for piece in packing.pieces({"t": seq}):
            if not packing.add(piece):
                rows += packing.rows()
                packing = op.new_round()
                assert packing.add(piece)
    return rows + packing.rows()


def concat_pack(op, seqs):
    rows, row = [], op.new_row()
    for seq in seqs:
        offsets = None
        while True:
            rest = row.add({"t": seq}, offsets)
            if rest is None:
                if row.full:
                    rows.append(row.finish())
                    row = op.new_row()
                break
            rows.append(row.finish())
            row, offsets = op.new_row(), rest
    return rows + ([] if row.empty else [row.finish()])


def segments(row, key="t"):
    ids = row[f"{key}_segment_ids"]
    return [row[key][ids == s] for s in range(1, int(ids.max(initial=0)) + 1)]


def check_row_layout(row, cap, key="t"):
    ids, pos = row[f"{key}_segment_ids"], row[f"{key}_positions"]
    assert len(row[key]) == len(ids) == len(pos) == cap
    assert ids.dtype == pos.dtype == np.int32
    for s in range(1, int(ids.max(initial=0)) + 1):
        where = np.flatnonzero(ids == s)
        assert where.size and (np.diff(where) == 1).all(), "a segment is contiguous"
        assert pos[where].tolist() == list(range(where.size))
    assert (row[key][ids == 0] == 0).all() and (pos[ids == 0] == 0).all()


@settings(max_examples=80, deadline=None)
@given(lengths=lengths, cap=st.integers(4, 40), bins=st.integers(1, 6),
       kind=st.sampled_from([FirstFitPack, BestFitPack]))
def test_fit_packers_keep_every_sequence_whole_and_cut_only_longer_ones(lengths, cap, bins, kind):
    seqs = sequences(lengths)
    rows = fit_pack(kind({"t": cap}, bins, shuffle_bins=False), seqs)
    for row in rows:
        check_row_layout(row, cap)
    packed = sorted(tuple(s.tolist()) for row in rows for s in segments(row))
    expected = sorted(tuple(seq[i : i + cap].tolist()) for seq in seqs for i in range(0, len(seq), cap))
    assert packed == expected


@settings(max_examples=60, deadline=None)
@given(lengths=lengths, cap=st.integers(4, 40), bins=st.integers(1, 6))
def test_fit_packers_place_every_token_and_first_fit_keeps_stream_order_in_a_row(lengths, cap, bins):
    seqs = sequences(lengths)
    first = fit_pack(FirstFitPack({"t": cap}, bins, shuffle_bins=False), seqs)
    best = fit_pack(BestFitPack({"t": cap}, bins, shuffle_bins=False), seqs)
    for rows in (first, best):
        assert sum((r["t_segment_ids"] > 0).sum() for r in rows) == sum(lengths)
    # First-fit puts each sequence into the first row with room: within a row, its
    # sequences come in stream order.
    for row in first:
        starts = [int(s[0]) // 1000 for s in segments(row)]
        assert starts == sorted(starts)


@settings(max_examples=80, deadline=None)
@given(lengths=lengths, cap=st.integers(2, 40), split_full=st.booleans())
def test_concat_then_split_loses_and_reorders_no_token(lengths, cap, split_full):
    seqs = sequences(lengths)
    rows = concat_pack(ConcatThenSplit({"t": cap}, split_full_length_features=split_full), seqs)
    for row in rows:
        check_row_layout(row, cap)
    tokens = np.concatenate([s for row in rows for s in segments(row)])
    assert tokens.tolist() == np.concatenate(seqs).tolist()
    if split_full:  # rows are full but the last
        assert all((r["t_segment_ids"] > 0).all() for r in rows[:-1])
    else:  # a sequence exactly a row long keeps a row of its own
        for seq in seqs:
            if len(seq) == cap:
                assert any(r["t"].tolist() == seq.tolist() for r in rows)


@settings(max_examples=60, deadline=None)
@given(lengths=lengths, cap=st.integers(2, 40), starts_with_bos=st.booleans())
def test_concat_then_split_bos_inserts_never_overwrites(lengths, cap, starts_with_bos):
    bos = -1
    seqs = sequences(lengths)
    if starts_with_bos:
        seqs = [np.concatenate([[bos], s]) for s in seqs]
    op = ConcatThenSplit({"t": cap}, bos_handling=BOSHandling.REPLACE_FIRST_TOKEN_WITH_BOS,
                         bos_features=["t"], bos_token_id=bos)
    rows = concat_pack(op, seqs)
    kept = []
    for row in rows:
        for seg in segments(row):
            assert seg[0] == bos, "every segment starts with BOS"
            kept.append(seg)
    stream = np.concatenate(kept)
    assert stream[stream != bos].tolist() == np.concatenate(seqs)[np.concatenate(seqs) != bos].tolist()


def test_concat_then_split_splits_each_feature_where_its_row_is_full():
    op = ConcatThenSplit({"inputs": 4, "targets": 4})
    row = op.new_row()
    rest = row.add({"inputs": np.arange(1, 6), "targets": np.arange(11, 14)}, None)
    assert rest == {"inputs": 4, "targets": 3}
    out = row.finish()
    assert out["inputs"].tolist() == [1, 2, 3, 4] and out["targets"].tolist() == [11, 12, 13, 0]


def test_meta_features_are_packed_without_segments_or_listed_per_row():
    op = FirstFitPack({"t": 6, "lang": 6}, 2, meta_features=["lang", "doc"], shuffle_bins=False)
    packing = op.new_round()
    for k, n in enumerate([3, 2, 4]):
        assert packing.add({"t": np.arange(n) + 1, "lang": np.full(n, k + 1), "doc": f"d{k}"})
    first, second = packing.rows()
    assert sorted(first) == ["doc", "lang", "t", "t_positions", "t_segment_ids"]
    assert first["doc"] == ["d0", "d1"] and second["doc"] == ["d2"]
    assert first["lang"].tolist() == [1, 1, 1, 2, 2, 0]


def test_alignment_starts_each_sequence_on_a_multiple_and_padding_fills_the_rest():
    op = FirstFitPack({"t": 8}, 1, pack_alignment_struct={"t": 4}, padding_struct={"t": -7},
                      shuffle_bins=False)
    packing = op.new_round()
    assert packing.add({"t": np.array([1, 2, 3])}) and packing.add({"t": np.array([4])})
    assert not packing.add({"t": np.array([5])})  # cells 4..7 taken up to the next multiple
    (row,) = packing.rows()
    assert row["t"].tolist() == [1, 2, 3, -7, 4, -7, -7, -7]
    assert row["t_segment_ids"].tolist() == [1, 1, 1, 0, 2, 0, 0, 0]


def test_max_sequences_per_bin_caps_the_segments_of_a_row():
    op = FirstFitPack({"t": 100}, 2, max_sequences_per_bin=2, shuffle_bins=False)
    packing = op.new_round()
    assert all(packing.add({"t": np.array([k])}) for k in range(4))
    assert not packing.add({"t": np.array([9])})
    assert [int(r["t_segment_ids"].max()) for r in packing.rows()] == [2, 2]


def test_shuffled_rows_are_a_permutation_that_depends_on_seed_and_round():
    op = FirstFitPack({"t": 2}, 8, seed=3)
    rows = [{"t": np.array([k, k])} for k in range(8)]
    order = op.row_order(rows, counter=0)
    assert sorted(order) == list(range(8)) and order != list(range(8))
    assert order == op.row_order(rows, counter=0)
    assert order != op.row_order(rows, counter=8)
    assert order != FirstFitPack({"t": 2}, 8, seed=4).row_order(rows, counter=0)


def test_group_by_feature_orders_rows_by_their_mean_group():
    op = FirstFitPack({"t": 2}, 4, seed=1, shuffle_bins_group_by_feature="t")
    rows = [{"t": np.array([g, g])} for g in (4, 1, 3, 2)]
    assert [int(rows[r]["t"][0]) for r in op.row_order(rows, 0)] == [1, 2, 3, 4]


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"length_struct": {"t": 0}, "num_packing_bins": 2}, ValueError, r"length_struct\['t'\] must be a positive integer, got 0"),
    ({"length_struct": [4], "num_packing_bins": 2}, TypeError, r"length_struct must be a non-empty dict"),
    ({"length_struct": {"t": 4}, "num_packing_bins": 0}, ValueError, r"num_packing_bins must be a positive integer, got 0"),
    ({"length_struct": {"t": 4}, "num_packing_bins": 2, "shuffle_bins": "yes"}, TypeError, r"shuffle_bins must be True or False"),
    ({"length_struct": {"t": 4}, "num_packing_bins": 2, "max_sequences_per_bin": 0}, ValueError, r"max_sequences_per_bin must be a positive integer"),
    ({"length_struct": {"t": 4}, "num_packing_bins": 2, "pack_alignment_struct": {"u": 2}}, ValueError, r"pack_alignment_struct names \['u'\]"),
    ({"length_struct": {"t": 4}, "num_packing_bins": 2, "meta_features": "t"}, TypeError, r"meta_features must be a list"),
])
def test_fit_packer_arguments_are_checked(kwargs, error, match):
    with pytest.raises(error, match=match):
        FirstFitPack(**kwargs)


def test_concat_then_split_arguments_are_checked():
    with pytest.raises(ValueError, match=r"DO_NOTHING adds no BOS, so leave bos_features and bos_token_id unset"):
        ConcatThenSplit({"t": 4}, bos_token_id=1)
    with pytest.raises(ValueError, match=r"needs an integer bos_token_id, got None"):
        ConcatThenSplit({"t": 4}, bos_handling=BOSHandling.REPLACE_FIRST_TOKEN_WITH_BOS, bos_features=["t"])
    with pytest.raises(ValueError, match=r"meta_features \['x'\] are not in length_struct"):
        ConcatThenSplit({"t": 4}, meta_features=["x"])


def test_an_element_without_a_packed_feature_is_named():
    packing = FirstFitPack({"tokens": 4}, 1).new_round()
    with pytest.raises(KeyError, match=r"the element has no feature 'tokens' of length_struct \(it has \['text'\]\)"):
        packing.add({"text": "abc"})
    with pytest.raises(TypeError, match=r"packing needs dict elements with the features \['tokens'\], got list"):
        packing.add([1, 2])
