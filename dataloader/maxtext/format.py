"""MaxText's batch layout: ``inputs``/``targets`` with their segmentation and positions.

A language model learns to predict token ``t + 1`` from tokens ``0..t``. MaxText's input
pipeline hands its train step six arrays of shape ``(batch, max_target_length)``:

==========================  ===========================================================
``inputs``                  the tokens of the (packed) row
``inputs_segmentation``     1, 2, ... per sequence in the row, 0 for padding (attention
                            stays within a segment)
``inputs_position``         0..n-1 within each segment (position embeddings)
``targets``                 the next token: ``inputs`` shifted left by one, ``pad_id``
                            in the last column
``targets_segmentation``    the loss weight: the target's segment, 0 where there is no
                            target to learn
``targets_position``        as ``inputs_position`` (MaxText does not shift it)
==========================  ===========================================================

This is how MaxText writes them today (``input_pipeline_utils.shift_and_refine``): the
inputs stay, the targets and their segmentation move left by one. MaxText then zeroes
the segmentation where a target equals the pad id; we zero it where the target is
padding *by segment* (its segment is 0), so a real token that happens to share the pad
id is still learnt. And by default we also zero it where the target crosses into the
next segment: at a sequence's last token the "next token" is the first token of another
document, which nothing in the row's own segment can predict. MaxText trains on that
position; ``mask_boundaries=False, ignored_ids=(pad_id,)`` gives MaxText's arrays
exactly.

Example (one row, two sequences ``[5, 6, 7]`` and ``[8, 9]``, one padding cell):
    >>> row = {"tokens": np.array([5, 6, 7, 8, 9, 0]),
    ...        "tokens_segment_ids": np.array([1, 1, 1, 2, 2, 0]),
    ...        "tokens_positions": np.array([0, 1, 2, 0, 1, 0])}
    >>> out = maxtext_layout(row)
    >>> out["targets"].tolist(), out["targets_segmentation"].tolist()
    ([6, 7, 8, 9, 0, 0], [1, 1, 0, 2, 0, 0])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dataloader.operations import MapTransform

KEYS = ("inputs", "inputs_segmentation", "inputs_position",
        "targets", "targets_segmentation", "targets_position")


def _shift_left(x: np.ndarray, fill: int) -> np.ndarray:
    """``x`` moved one step left along the last axis, ``fill`` in the last column."""
    out = np.empty_like(x)
    out[..., :-1] = x[..., 1:]
    out[..., -1] = fill
    return out


def maxtext_layout(
    element: Mapping[str, Any],
    *,
    feature: str = "tokens",
    pad_id: int = 0,
    mask_boundaries: bool = True,
    ignored_ids: Sequence[int] = (),
) -> dict[str, Any]:
    """MaxText's six arrays from a packed row or batch of rows (last axis: the sequence).

    Args:
        element: a dict with ``feature``, ``<feature>_segment_ids`` and
            ``<feature>_positions`` (what the packers and :class:`PadToLength` write);
            other keys (a batch's ``mask``, say) are kept.
        feature: the packed feature holding the tokens.
        pad_id: the target of the last column (MaxText's pad id).
        mask_boundaries: zero ``targets_segmentation`` where the target belongs to
            another segment than its input (see the module docstring).
        ignored_ids: targets equal to one of these get ``targets_segmentation`` 0 too
            (MaxText passes its pad id).

    Raises:
        KeyError: a key is missing (naming it and the keys there are).
    """
    names = (feature, f"{feature}_segment_ids", f"{feature}_positions")
    missing = [k for k in names if k not in element]
    if missing:
        raise KeyError(
            f"MaxText's layout is made from {list(names)}, but {missing} are missing (the "
            f"element has {sorted(element)}); pack the tokens, or pad them with PadToLength, first"
        )
    tokens = np.asarray(element[feature])
    segments = np.asarray(element[names[1]], dtype=np.int32)
    positions = np.asarray(element[names[2]], dtype=np.int32)
    targets = _shift_left(tokens, pad_id)
    target_segments = _shift_left(segments, 0)
    if mask_boundaries:
        target_segments = np.where(target_segments == segments, target_segments, 0).astype(np.int32)
    for ignored in ignored_ids:
        target_segments = np.where(targets != ignored, target_segments, 0).astype(np.int32)
    out = {k: v for k, v in element.items() if k not in names}
    out.update(inputs=tokens, inputs_segmentation=segments, inputs_position=positions,
               targets=targets, targets_segmentation=target_segments, targets_position=positions)
    return out


class MaxTextFormat(MapTransform):
    """:func:`maxtext_layout` as an operation (on rows or on batches of rows)."""

    def __init__(self, *, feature: str = "tokens", pad_id: int = 0, mask_boundaries: bool = True,
                 ignored_ids: Sequence[int] = ()) -> None:
        super().__init__()
        if isinstance(pad_id, bool) or not isinstance(pad_id, (int, np.integer)):
            raise TypeError(f"pad_id must be an integer, got {pad_id!r}")
        self.feature, self.pad_id = feature, int(pad_id)
        self.mask_boundaries = bool(mask_boundaries)
        self.ignored_ids = tuple(int(i) for i in ignored_ids)

    def map(self, element: Any) -> dict[str, Any]:
        return maxtext_layout(element, feature=self.feature, pad_id=self.pad_id,
                              mask_boundaries=self.mask_boundaries, ignored_ids=self.ignored_ids)

    @property
    def name(self) -> str:
        return f"MaxTextFormat(pad_id={self.pad_id}, mask_boundaries={self.mask_boundaries})"


class PadToLength(MapTransform):
    """One sequence per row, without packing: trimmed or padded to ``length``.

    Writes ``<feature>``, ``<feature>_segment_ids`` (1 on the tokens, 0 on padding) and
    ``<feature>_positions`` (0..n-1, 0 on padding), the keys a packer writes, so that
    :class:`MaxTextFormat` reads either. MaxText's ``PadOrTrimToMaxLength`` does the same
    (it counts positions over the padding too; those cells carry no loss either way).

    Example:
        >>> out = PadToLength(4).map({"tokens": np.array([7, 8])})
        >>> out["tokens"].tolist(), out["tokens_segment_ids"].tolist()
        ([7, 8, 0, 0], [1, 1, 0, 0])
    """

    def __init__(self, length: int, *, feature: str = "tokens", pad_id: int = 0) -> None:
        super().__init__()
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise ValueError(f"length must be a positive integer, got {length!r}")
        self.length, self.feature, self.pad_id = length, feature, int(pad_id)

    def map(self, element: Any) -> dict[str, Any]:
        tokens = np.asarray(element[self.feature])[: self.length]
        n = len(tokens)
        padded = np.full(self.length, self.pad_id, dtype=tokens.dtype)
        padded[:n] = tokens
        segments = np.zeros(self.length, np.int32)
        segments[:n] = 1
        positions = np.zeros(self.length, np.int32)
        positions[:n] = np.arange(n, dtype=np.int32)
        out = dict(element)
        out.update({self.feature: padded, f"{self.feature}_segment_ids": segments,
                    f"{self.feature}_positions": positions})
        return out

    @property
    def name(self) -> str:
        return f"PadToLength({self.length})"
