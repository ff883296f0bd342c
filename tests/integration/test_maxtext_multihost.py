"""MaxText's pipeline on 2 JAX processes: global arrays, and an eval pass that keeps
every sequence although the hosts' shards pack into different numbers of batches."""

from __future__ import annotations

import os

import numpy as np
import pytest

import dataloader as dl
from tests import tokenizer_files as tf
from tests.integration import cluster
from tests.integration.maxtext_main import LENGTH, PER_DEVICE, TRAIN_STEPS, keys

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.timeout(300)]

SCRIPT = os.path.join(cluster.ROOT, "tests", "integration", "maxtext_main.py")
HOSTS, LOCAL_BATCH = 2, 2 * PER_DEVICE  # 2 devices per process


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("maxtext_hosts")
    lines = tf.corpus(200)
    for shard in range(2):
        dl.write_array_record(folder / f"train-{shard}.array_record", [t.encode() for t in lines[shard:160:2]])
    # Eval positions alternate a long and a short text: host 0 reads the long ones (and
    # packs more rows), host 1 the short ones.
    held_out = [(lines[i] + " " + lines[i + 1]) if i % 2 == 0 else lines[i].split()[0] for i in range(160, 200)]
    dl.write_array_record(folder / "eval.array_record", [t.encode() for t in held_out])
    tf.huggingface_json(str(folder))
    return str(folder)


def _stitch(parts: list[list]) -> dict[int, list]:
    rows: dict[int, list] = {}
    for start, values in parts:
        for offset, row in enumerate(values):
            assert start + offset not in rows, f"row {start + offset} held twice"
            rows[start + offset] = row
    return rows


def _expected(data: str, host: int, *, eval: bool) -> list[dict]:
    """What host ``host`` of 2 reads, computed in one process with its shard options."""
    config = dl.maxtext.parse_maxtext_config(keys(data))
    build = dl.maxtext.eval_dataset if eval else dl.maxtext.train_dataset
    shard = dl.ShardOptions(host, HOSTS, drop_remainder=not eval)
    return list(build(config, global_batch_size=LOCAL_BATCH, shard_options=shard))


def test_global_batches_and_a_padded_eval_across_two_hosts(data, tmp_path):
    reports = cluster.finish(cluster.start(SCRIPT, HOSTS, tmp_path, "maxtext", "--data", data))
    # Training: every step one global array of HOSTS * LOCAL_BATCH rows; host h holds its shard's batch.
    for host, report in enumerate(reports):
        expected = _expected(data, host, eval=False)[:TRAIN_STEPS]
        for step, seen in enumerate(report["train"]):
            assert seen["shape"] == [HOSTS * LOCAL_BATCH, LENGTH]
            rows = _stitch(seen["inputs"])
            assert sorted(rows) == list(range(host * LOCAL_BATCH, (host + 1) * LOCAL_BATCH))
            assert [rows[r] for r in sorted(rows)] == expected[step]["inputs"].tolist()
            segments = _stitch(seen["targets_segmentation"])
            assert [segments[r] for r in sorted(segments)] == expected[step]["targets_segmentation"].tolist()
    # Eval: both hosts take the same number of steps; the one that ran out fills in
    # all-padding batches; every real row of each host's shard is there once.
    steps = {len(r["eval"]) for r in reports}
    assert len(steps) == 1
    counts = [len(_expected(data, host, eval=True)) for host in range(HOSTS)]
    assert counts[0] != counts[1] and steps == {max(counts)}
    for host, report in enumerate(reports):
        expected = _expected(data, host, eval=True)
        assert report["padding_batches"] == max(counts) - counts[host]
        real = []
        for seen in report["eval"]:
            assert seen["shape"] == [HOSTS * LOCAL_BATCH, LENGTH]
            mask, inputs = _stitch(seen["mask"]), _stitch(seen["inputs"])
            real += [inputs[r] for r in sorted(inputs) if mask[r]]
        want = [row.tolist() for b in expected for row, m in zip(b["inputs"], b["mask"]) if m]
        assert real == want and np.asarray(want).shape[1] == LENGTH
