"""Shard plans: contiguous runs over the concatenated inputs, or one shard per file."""

from __future__ import annotations

import numpy as np
import pytest

from dataloader.beam.plan import contiguous_plans, matched_plans


@pytest.mark.parametrize(("counts", "num_shards"), [([10], 3), ([3, 0, 8, 1], 4), ([5, 5], 10), ([7, 1, 1], 1)])
def test_contiguous_shards_cover_every_record_once_in_order(counts, num_shards):
    plans = contiguous_plans("out/x", counts, num_shards)
    order = [(f, i) for plan in plans for f, start, stop in plan.slices for i in range(start, stop)]
    assert order == [(f, i) for f, n in enumerate(counts) for i in range(n)]
    sizes = [sum(stop - start for _, start, stop in plan.slices) for plan in plans]
    total = sum(counts)
    assert sizes == np.diff(np.linspace(0, total, num_shards + 1).astype(int)).tolist()
    assert [p.path for p in plans] == [f"out/x-{s:05d}-of-{num_shards:05d}.array_record" for s in range(num_shards)]


def test_more_shards_than_records_is_refused():
    with pytest.raises(ValueError, match=r"3 records cannot fill 4 shards; use num_shards <= 3"):
        contiguous_plans("out/x", [1, 2], 4)


def test_matched_shards_are_named_after_their_inputs():
    plans = matched_plans("out/train", ["in/a-00000.tfrecord", "gs://b/in/b.JSONL", "in/c.data"])
    assert [p.path for p in plans] == ["out/train-a-00000.array_record", "out/train-b.array_record",
                                       "out/train-c.data.array_record"]
    assert [p.slices for p in plans] == [((0, 0, None),), ((1, 0, None),), ((2, 0, None),)]


def test_matched_shards_refuse_two_inputs_of_one_name():
    with pytest.raises(ValueError, match=r"would write both 'x/a\.jsonl' and 'y/a\.jsonl' to 'out/t-a\.array_record'"):
        matched_plans("out/t", ["x/a.jsonl", "y/a.jsonl"])
