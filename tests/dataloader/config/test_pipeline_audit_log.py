"""``loader.audit_log`` in a pipeline config: checked at load, passed to the DataLoader."""

from __future__ import annotations

import json

import pytest

from dataloader.config.pipeline import ConfigError, parse_config
from tests.dataloader.config.test_config import base


def test_a_config_audit_log_writes_a_line_per_step(tmp_path):
    path = tmp_path / "audit.jsonl"
    config = parse_config(base(), [f"loader.audit_log={path}"])
    assert config.loader.audit_log == str(path)
    it = config.build_loader().iterator()
    for _ in range(3):
        next(it)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 3]
    assert all(line["fingerprint"]["record_keys"] for line in lines)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("loader.audit_log=3", r"loader.audit_log: expected a non-empty string, got 3"),
        ("sampler.sharding={shard_index: 0, shard_count: 2}",
         r"loader.audit_log: 'audit.jsonl' would be written by every shard .*put \{shard\} in it"),
    ],
)
def test_a_bad_audit_log_is_refused_at_load_naming_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(base(), ["loader.audit_log=audit.jsonl", override])


def test_a_sharded_config_with_the_shard_in_the_path_loads():
    overrides = ["sampler.sharding={shard_index: 1, shard_count: 2}", "loader.audit_log=audit-{shard}.jsonl"]
    assert parse_config(base(), overrides).loader.audit_log == "audit-{shard}.jsonl"
