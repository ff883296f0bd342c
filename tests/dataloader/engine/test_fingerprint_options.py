"""``audit_log`` through the dataset API's options (``DatasetOptions(audit_log=...)``)."""

from __future__ import annotations

import json

import pytest

import dataloader as dl
import dataloader.experimental as ge


def test_dataset_options_audit_log_writes_a_line_per_step_of_the_datasets_iterator(tmp_path):
    path = tmp_path / "audit.jsonl"
    ds = dl.MapDataset.range(20).shuffle(seed=1).batch(4).to_iter_dataset()
    it = iter(ge.WithOptionsIterDataset(ds, ge.DatasetOptions(audit_log=str(path))))
    for _ in range(3):
        next(it)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 3]
    assert len(lines[-1]["fingerprint"]["record_keys"]) == 4


def test_dataset_options_audit_log_must_be_a_path():
    with pytest.raises(TypeError, match=r"DatasetOptions.audit_log must be a path .* got 3"):
        ge.DatasetOptions(audit_log=3)


def test_dataset_options_audit_log_of_a_sharded_stream_needs_the_shard(tmp_path):
    options = ge.DatasetOptions(audit_log=str(tmp_path / "a.jsonl"))
    with pytest.raises(ValueError, match=r"would be written by each of the 2 shards; put \{shard\} in the path"):
        dl.DataLoader(dl.RangeDataSource(20), dl.IndexSampler(20, dl.ShardOptions(0, 2)), [dl.Batch(4)], options=options)
