"""batch_and_pad (Grain's), batch_and_pad_with_mask / BatchAndPad: static shapes, nothing dropped."""

from __future__ import annotations

import collections

import numpy as np
import pytest

import dataloader as dl
from dataloader.operations.padding import BatchAndPad, batch_and_pad, batch_and_pad_with_mask


def test_short_batch_is_padded_to_full_size_with_a_mask():
    out = batch_and_pad_with_mask([{"x": np.arange(3)}, {"x": np.arange(3) + 3}], batch_size=4, pad_value=-1)
    assert out["x"].tolist() == [[0, 1, 2], [3, 4, 5], [-1, -1, -1], [-1, -1, -1]]
    assert out["mask"].tolist() == [True, True, False, False]
    assert out["x"].dtype == np.arange(3).dtype


def test_full_batch_has_an_all_true_mask():
    out = batch_and_pad_with_mask([{"x": 1}, {"x": 2}], batch_size=2)
    assert out["mask"].tolist() == [True, True]


def test_non_dict_elements_come_back_as_batch_and_mask():
    Pair = collections.namedtuple("Pair", "a b")
    batch, mask = batch_and_pad_with_mask([Pair(1, b"x")], batch_size=3)
    assert batch.a.tolist() == [1, 0, 0] and batch.b.tolist() == [b"x", b"", b""]
    assert mask.tolist() == [True, False, False]


def test_pad_value_per_key():
    out = batch_and_pad_with_mask([{"t": np.int32(5), "y": 1.5}], batch_size=2, pad_value={"t": 7})
    assert out["t"].tolist() == [5, 7] and out["y"].tolist() == [1.5, 0.0]


def test_existing_mask_key_is_refused():
    with pytest.raises(ValueError, match=r"already have a field 'mask'; pass another mask_key"):
        batch_and_pad_with_mask([{"mask": 1}], batch_size=2)


def test_more_elements_than_the_batch_size_are_refused():
    with pytest.raises(ValueError, match="got 3 elements for batch_size=2"):
        batch_and_pad_with_mask([1, 2, 3], batch_size=2)


def test_pad_value_that_does_not_fit_names_the_field():
    with pytest.raises(ValueError, match=r"cannot fill field \['x'\] \(dtype uint8\) with pad value -1"):
        batch_and_pad_with_mask([{"x": np.uint8(1)}], batch_size=2, pad_value=-1)


def test_batch_and_pad_in_a_loader_keeps_every_record_and_every_shape():
    loader = dl.DataLoader(
        dl.RangeDataSource(10), dl.SequentialSampler(10),
        [dl.MapTransform(lambda x: {"x": np.int64(x)}), BatchAndPad(4)],
    )
    batches = list(loader)
    assert [b["x"].shape for b in batches] == [(4,)] * 3
    assert [int(b["mask"].sum()) for b in batches] == [4, 4, 2]
    assert np.concatenate([b["x"][b["mask"]] for b in batches]).tolist() == list(range(10))


def test_grains_batch_and_pad_pads_with_the_value_and_adds_no_mask():
    import functools

    import dataloader as dl

    ds = dl.MapDataset.range(1, 5).batch(3, batch_fn=functools.partial(batch_and_pad, batch_size=3))
    assert [b.tolist() for b in ds] == [[1, 2, 3], [4, 0, 0]]
    out = batch_and_pad([{"x": np.ones(2, np.float32)}], batch_size=2, pad_value=-1)
    assert sorted(out) == ["x"] and out["x"].tolist() == [[1.0, 1.0], [-1.0, -1.0]]


def test_grains_batch_and_pad_refuses_more_values_than_the_batch():
    with pytest.raises(ValueError, match=r"batch_and_pad got 3 values for batch_size=2"):
        batch_and_pad([1, 2, 3], batch_size=2)
