"""MaxText's six arrays, checked on rows computed by hand."""

from __future__ import annotations

import numpy as np
import pytest

from dataloader.maxtext import KEYS, MaxTextFormat, PadToLength, maxtext_layout

# One row of 8: sequence A = [11, 12, 13], sequence B = [21, 22, 23, 24], one padding cell.
ROW = {
    "tokens": np.array([11, 12, 13, 21, 22, 23, 24, 0], np.int32),
    "tokens_segment_ids": np.array([1, 1, 1, 2, 2, 2, 2, 0], np.int32),
    "tokens_positions": np.array([0, 1, 2, 0, 1, 2, 3, 0], np.int32),
}


def test_inputs_stay_and_targets_are_the_next_token():
    out = maxtext_layout(ROW)
    assert sorted(out) == sorted(KEYS)
    assert out["inputs"].tolist() == [11, 12, 13, 21, 22, 23, 24, 0]
    assert out["targets"].tolist() == [12, 13, 21, 22, 23, 24, 0, 0]
    assert out["inputs_segmentation"].tolist() == [1, 1, 1, 2, 2, 2, 2, 0]
    assert out["inputs_position"].tolist() == [0, 1, 2, 0, 1, 2, 3, 0]
    assert out["targets_position"].tolist() == [0, 1, 2, 0, 1, 2, 3, 0]  # not shifted, as MaxText


def test_no_loss_where_the_target_is_padding_or_in_the_next_segment():
    out = maxtext_layout(ROW)
    # 13 -> 21 crosses from A into B; 24 -> pad and the last column have no target.
    assert out["targets_segmentation"].tolist() == [1, 1, 0, 2, 2, 2, 0, 0]
    assert all(v.dtype == np.int32 for v in out.values())


def test_maxtexts_own_masking_when_asked():
    """MaxText (shift_and_refine) keeps the crossing target and masks targets equal to its pad id."""
    row = dict(ROW, tokens=np.array([11, 12, 13, 21, 0, 23, 24, 0], np.int32))  # a real token 0 in B
    ours = maxtext_layout(row)
    theirs = maxtext_layout(row, mask_boundaries=False, ignored_ids=(0,))
    assert ours["targets_segmentation"].tolist() == [1, 1, 0, 2, 2, 2, 0, 0]
    assert theirs["targets_segmentation"].tolist() == [1, 1, 2, 0, 2, 2, 0, 0]


def test_batches_shift_along_the_sequence_axis_and_keep_other_keys():
    batch = {k: np.stack([v, v[::-1]]) for k, v in ROW.items()}
    batch["mask"] = np.array([True, False])
    out = MaxTextFormat(pad_id=-1).map(batch)
    assert out["targets"][0].tolist() == [12, 13, 21, 22, 23, 24, 0, -1]
    assert out["targets"][1].tolist() == [24, 23, 22, 21, 13, 12, 11, -1]
    assert out["mask"].tolist() == [True, False]
    # Row 1 starts with a padding cell: input padding -> target 24 is not learnt either.
    assert out["targets_segmentation"][1].tolist() == [0, 2, 2, 2, 0, 1, 1, 0]


def test_pad_to_length_is_one_segment_per_row():
    out = PadToLength(5).map({"tokens": np.array([7, 8, 9], np.int32), "id": 3})
    assert out["tokens"].tolist() == [7, 8, 9, 0, 0] and out["id"] == 3
    assert out["tokens_segment_ids"].tolist() == [1, 1, 1, 0, 0]
    assert out["tokens_positions"].tolist() == [0, 1, 2, 0, 0]
    assert maxtext_layout(out)["targets_segmentation"].tolist() == [1, 1, 0, 0, 0]
    assert PadToLength(2).map({"tokens": np.arange(5)})["tokens"].tolist() == [0, 1]


def test_a_row_without_segments_is_refused_with_the_keys_it_has():
    with pytest.raises(KeyError, match=r"\['tokens_segment_ids', 'tokens_positions'\] are missing \(the element has \['tokens'\]\)"):
        maxtext_layout({"tokens": np.arange(3)})
    with pytest.raises(ValueError, match=r"length must be a positive integer, got 0"):
        PadToLength(0)
