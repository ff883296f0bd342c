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
    PackAndBatchOperation,
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
    """All rows of a stream through concat-then-split, fill by fill (as the stage drives
    it): rows of full-length sequences passed through come after the row being filled."""
    rows, row, alone = [], op.new_row(), []
    for seq in seqs:
        element, offsets = {"t": seq}, None
        if op.passes_through(element):
            alone.append(op.single_row(element))
            continue
        while (offsets := row.add(element, offsets)) is not None:
            rows += [row.finish(), *alone]
            row, alone = op.new_row(), []
    return rows + ([] if row.empty else [row.finish()]) + alone


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
    if split_full:  # rows are full but the last, and hold the stream in order
        assert tokens.tolist() == np.concatenate(seqs).tolist()
        assert all((r["t_segment_ids"] > 0).all() for r in rows[:-1])
    else:  # a sequence exactly a row long is a row of its own; the others keep their order
        full = [seq for seq in seqs if len(seq) == cap]
        for seq in full:
            assert any(r["t"].tolist() == seq.tolist() and (r["t_segment_ids"] == 1).all() for r in rows)
        rest = [s for s in seqs if len(s) != cap]
        kept = [t for t in tokens.tolist() if len(seqs[t // 1000]) != cap]
        assert kept == (np.concatenate(rest).tolist() if rest else [])
        assert sorted(tokens.tolist()) == sorted(np.concatenate(seqs).tolist())


@settings(max_examples=60, deadline=None)
@given(lengths=lengths, cap=st.integers(2, 40), starts_with_bos=st.booleans())
def test_concat_then_split_insert_bos_never_overwrites(lengths, cap, starts_with_bos):
    bos = -1
    seqs = sequences(lengths)
    if starts_with_bos:
        seqs = [np.concatenate([[bos], s]) for s in seqs]
    op = ConcatThenSplit({"t": cap}, bos_handling=BOSHandling.INSERT_BOS,
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
    with pytest.raises(ValueError, match=r"needs a sequence to split, but every feature of length_struct "
                                         r"\{'t': 4\} is in meta_features \['t'\]"):
        ConcatThenSplit({"t": 4}, meta_features=["t"])


@pytest.mark.parametrize("split_full", [True, False])
def test_concat_then_split_refuses_an_element_with_a_feature_it_has_no_length_for(split_full):
    """Grain refuses it; packing it would silently drop the feature from every row."""
    op = ConcatThenSplit({"t": 4}, split_full_length_features=split_full)
    assert [r["t"].tolist() for r in concat_pack(op, [np.arange(1, 4)])] == [[1, 2, 3, 0]]
    with pytest.raises(ValueError, match=r"the element has features \['label'\] that length_struct "
                                         r"\{'t': 4\} gives no row length; .* drop it with a map"):
        op.passes_through({"t": np.arange(4), "label": 1}) or op.new_row().add({"t": np.arange(4), "label": 1}, None)


def test_an_element_without_a_packed_feature_is_named():
    packing = FirstFitPack({"tokens": 4}, 1).new_round()
    with pytest.raises(KeyError, match=r"the element has no feature 'tokens' of length_struct \(it has \['text'\]\)"):
        packing.add({"text": "abc"})
    with pytest.raises(TypeError, match=r"packing needs dict elements with the features \['tokens'\], got list"):
        packing.add([1, 2])


def runs(lengths_, key="t"):
    """Sequence i is a run of the value i + 1 (its length from ``lengths_``)."""
    return [{key: np.full(n, i + 1, np.int32)} for i, n in enumerate(lengths_)]


def test_full_length_sequences_pass_through_after_the_row_being_filled_as_in_grain():
    """Grain's own example (its ConcatThenSplit docstring; grain 0.2.18 prints the same)."""
    op = ConcatThenSplit({"t": 6}, split_full_length_features=False)
    rows = concat_pack(op, [e["t"] for e in runs([3, 6, 2, 5, 6, 4])])
    assert [r["t"].tolist() for r in rows] == [
        [1, 1, 1, 3, 3, 4], [2, 2, 2, 2, 2, 2], [4, 4, 4, 4, 6, 6], [5, 5, 5, 5, 5, 5], [6, 6, 0, 0, 0, 0]]
    assert op.passes_through({"t": np.zeros(6)}) and not op.passes_through({"t": np.zeros(5)})
    assert not ConcatThenSplit({"t": 6}).passes_through({"t": np.zeros(6)})  # the default splits


@settings(max_examples=60, deadline=None)
@given(lengths=lengths, cap=st.integers(2, 40))
def test_concat_then_split_replace_first_token_overwrites_each_segments_first_cell(lengths, cap):
    """Grain's REPLACE_FIRST_TOKEN_WITH_BOS: the rows hold the stream's tokens in order,
    cut where Grain cuts them, with each segment's first cell (a sequence's start or a
    split's continuation) overwritten by BOS."""
    bos = -1
    seqs = sequences(lengths)
    op = ConcatThenSplit({"t": cap}, bos_handling=BOSHandling.REPLACE_FIRST_TOKEN_WITH_BOS,
                         bos_features=["t"], bos_token_id=bos)
    plain = concat_pack(ConcatThenSplit({"t": cap}), seqs)
    rows = concat_pack(op, seqs)
    assert len(rows) == len(plain)
    for row, cut in zip(rows, plain):
        assert row["t_segment_ids"].tolist() == cut["t_segment_ids"].tolist()
        assert row["t_positions"].tolist() == cut["t_positions"].tolist()
        for seg, original in zip(segments(row), segments(cut)):
            assert seg.tolist() == [bos, *original[1:].tolist()]


def test_replace_first_token_packs_rows_as_grain_does():
    """Sequences of 1, 2, 3, 5 and 7 tokens (token k repeated k times) in rows of 5: each
    segment's first cell is BOS, a split loses its continuation's first token, and the
    sequence of exactly 5 is a row of its own after the row being filled."""
    op = ConcatThenSplit({"t": 5}, split_full_length_features=False,
                         bos_handling=BOSHandling.REPLACE_FIRST_TOKEN_WITH_BOS, bos_features=["t"],
                         bos_token_id=99)
    rows = concat_pack(op, [np.full(k, k) for k in (1, 2, 3, 5, 7)])
    assert [r["t"].tolist() for r in rows] == [
        [99, 99, 2, 99, 3], [99, 99, 7, 7, 7], [99, 5, 5, 5, 5], [99, 7, 7, 0, 0]]
    assert [r["t_segment_ids"].tolist() for r in rows] == [
        [1, 2, 2, 3, 3], [1, 2, 2, 2, 2], [1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    assert [r["t_positions"].tolist() for r in rows] == [
        [0, 0, 1, 0, 1], [0, 0, 1, 2, 3], [0, 1, 2, 3, 4], [0, 1, 2, 0, 0]]


def test_full_length_counts_the_bos_that_would_be_inserted():
    op = ConcatThenSplit({"t": 4}, split_full_length_features=False,
                         bos_handling=BOSHandling.INSERT_BOS, bos_features=["t"], bos_token_id=0)
    assert op.passes_through({"t": np.array([5, 6, 7])})  # BOS + 3 tokens fill the row
    assert not op.passes_through({"t": np.array([5, 6, 7, 8])})  # BOS + 4 would not fit
    assert op.passes_through({"t": np.array([0, 6, 7, 8])})  # it starts with BOS already
    assert op.single_row({"t": np.array([5, 6, 7])})["t"].tolist() == [0, 5, 6, 7]


def test_every_piece_of_a_split_element_carries_its_meta_features_whole():
    """As grain 0.2.18: element 2 is split over both rows, and both rows hold its meta [20, 20]."""
    op = ConcatThenSplit({"t": 6, "m": 4}, meta_features=["m"])
    elements = [{"t": np.full(n, i + 1, np.int32), "m": np.full(2, 10 * (i + 1), np.int32)}
                for i, n in enumerate([4, 5, 3])]
    rows, row, offsets = [], op.new_row(), None
    for e in elements:
        offsets = None
        while (offsets := row.add(e, offsets)) is not None:
            rows.append(row.finish())
            row = op.new_row()
    rows.append(row.finish())
    assert [(r["t"].tolist(), r["m"].tolist()) for r in rows] == [
        ([1, 1, 1, 1, 2, 2], [10, 10, 20, 20]), ([2, 2, 2, 3, 3, 3], [20, 20, 30, 30])]
    assert "m_segment_ids" not in rows[0]


def test_a_full_feature_does_not_complete_the_row_while_another_has_room():
    """As grain 0.2.18: ``a`` is full after two elements, yet element 3's ``b`` still fits
    in the first row; its ``a`` opens the second."""
    op = ConcatThenSplit({"a": 6, "b": 6})
    elements = [{"a": np.full(n, i + 1, np.int32), "b": np.full(m, i + 1, np.int32)}
                for i, (n, m) in enumerate([(4, 2), (2, 1), (3, 2)])]
    row = op.new_row()
    assert row.add(elements[0], None) is None and row.add(elements[1], None) is None
    rest = row.add(elements[2], None)
    assert rest == {"a": 0, "b": 2}
    first = row.finish()
    assert first["a"].tolist() == [1, 1, 1, 1, 2, 2]
    assert first["b"].tolist() == [1, 1, 2, 3, 3, 0] and first["b_segment_ids"].tolist() == [1, 1, 2, 3, 3, 0]
    second = op.new_row()
    assert second.add(elements[2], rest) is None
    assert second.finish()["a"].tolist() == [3, 3, 3, 0, 0, 0]


def test_nested_length_struct_packs_meta_features_into_nested_rows_as_grain():
    """Rows as grain 0.2.18's FirstFitPackIterDataset gives them (2 bins, no shuffle)."""
    op = FirstFitPack({"t": 8, "x": {"ids": 4, "k": 2}}, 2, shuffle_bins=False, meta_features=["x"])
    elements = [{"t": np.full(n, i + 1, np.int32), "x": {"ids": np.full(2, i + 1), "k": i}}
                for i, n in enumerate([3, 4, 2, 5])]
    rows = fit_pack_elements(op, elements)
    assert [r["t"].tolist() for r in rows] == [[1, 1, 1, 2, 2, 2, 2, 0], [3, 3, 4, 4, 4, 4, 4, 0]]
    assert [{k: v.tolist() for k, v in r["x"].items()} for r in rows] == [
        {"ids": [1, 1, 2, 2], "k": [0, 1]}, {"ids": [3, 3, 4, 4], "k": [2, 3]}]
    assert sorted(rows[0]) == ["t", "t_positions", "t_segment_ids", "x"]
    assert op.describe()["length_struct"] == {"t": 8, "x": {"ids": 4, "k": 2}}


def test_a_nested_meta_feature_that_does_not_fit_closes_the_round():
    op = FirstFitPack({"t": 8, "x": {"ids": 3}}, 1, shuffle_bins=False, meta_features=["x"])
    elements = [{"t": np.full(2, i + 1), "x": {"ids": np.full(2, i + 1)}} for i in range(2)]
    rows = fit_pack_elements(op, elements)
    assert [r["t"].tolist() for r in rows] == [[1, 1, 0, 0, 0, 0, 0, 0], [2, 2, 0, 0, 0, 0, 0, 0]]


def fit_pack_elements(op, elements):
    rows, packing = [], op.new_round()
    for element in elements:
        for piece in packing.pieces(element):
            if not packing.add(piece):
                rows += packing.rows()
                packing = op.new_round()
                assert packing.add(piece)
    return rows + packing.rows()


def test_a_nested_feature_that_is_not_meta_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"length_struct\['x'\] is a nested dict; nested features are packed "
                                         r"only as meta features .* add 'x' to meta_features"):
        BestFitPack({"t": 8, "x": {"ids": 4}}, 2)
    with pytest.raises(ValueError, match=r"length_struct\['x/ids'\] must be a positive integer, got 0"):
        FirstFitPack({"t": 8, "x": {"ids": 0}}, 2, meta_features=["x"])
    with pytest.raises(ValueError, match=r"ConcatThenSplit packs flat dicts of sequences, as Grain's does"):
        ConcatThenSplit({"t": 8, "x": {"ids": 4}}, meta_features=["x"])
    with pytest.raises(ValueError, match=r"length_struct\['x'\] is a nested dict"):  # it has no meta features
        PackAndBatchOperation({"t": 8, "x": {"ids": 4}}, 2)
    with pytest.raises(KeyError, match=r"the element's 'x' has no feature 'ids' of length_struct \(it has \['k'\]\)"):
        FirstFitPack({"t": 8, "x": {"ids": 4}}, 2, meta_features=["x"]).new_round().add({"t": [1], "x": {"k": 1}})
