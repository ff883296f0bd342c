"""A MaxText-shaped shuffled pipeline moved from Grain reads Grain's rows, in Grain's order.

MaxText's ArrayRecord pipeline (``src/maxtext/input_pipeline``): ``MapDataset.source``,
``shuffle(seed)``, ``repeat``, the host's ``[h::H]``, a parse ``map``,
``to_iter_dataset()``, ``batch``. It runs unchanged under ``GRANARY_PERMUTATION=grain``.

The golden batches were produced by grain 0.2.18 (/work/ext/grainvenv) running
:func:`pipeline` with ``g = grain`` (each batch's ``id`` column, for hosts 0 and 1 of 2,
every batch of the two epochs).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import dataloader as dl
from dataloader.samplers.index_sampler import PERMUTATION_ENV

GRAIN_IDS = {
    0: (
        [[14, 97, 88, 100, 83, 60, 85, 71], [16, 35, 87, 26, 93, 1, 52, 70], [32, 43, 37,
        54, 7, 69, 84, 10], [13, 17, 86, 78, 9, 68, 91, 96], [29, 0, 72, 58, 34, 2, 27, 40],
        [89, 73, 94, 76, 67, 45, 53, 47], [50, 3, 25, 46, 71, 67, 23, 47], [37, 7, 69, 55,
        45, 31, 8, 20], [11, 83, 6, 88, 48, 60, 30, 27], [99, 66, 3, 24, 26, 18, 89, 100],
        [87, 10, 36, 95, 81, 4, 98, 75], [0, 90, 5, 12, 15, 42, 93, 96], [97, 58, 92, 34,
        25]]
    ),
    1: (
        [[24, 65, 57, 81, 36, 98, 56, 5], [61, 55, 28, 75, 22, 30, 42, 64], [33, 41, 46, 66,
        62, 44, 15, 39], [82, 11, 23, 80, 19, 8, 49, 12], [48, 79, 21, 59, 20, 63, 99, 31],
        [77, 4, 51, 6, 95, 92, 18, 90], [38, 74, 74, 38, 40, 76, 68, 61], [32, 86, 43, 17,
        57, 28, 59, 21], [52, 91, 54, 85, 2, 14, 53, 82], [51, 19, 56, 41, 78, 35, 94, 70],
        [33, 84, 50, 73, 49, 22, 77, 63], [44, 65, 64, 1, 13, 80, 9, 29], [72, 16, 79, 39,
        62]]
    ),
}


class Records:
    """An ArrayRecord-like source: 101 serialized records, read by index."""

    def __len__(self):
        return 101

    def __getitem__(self, index):
        return json.dumps({"id": int(index), "text": "x" * (int(index) % 7)}).encode()


def parse(raw):
    record = json.loads(raw)
    return {"id": np.int64(record["id"]), "length": np.int64(len(record["text"]))}


def pipeline(g, host):
    ds = g.MapDataset.source(Records()).shuffle(seed=42).repeat(2)[host::2].map(parse)
    return ds.to_iter_dataset().batch(8)


@pytest.fixture
def grain_order(monkeypatch):
    monkeypatch.setenv(PERMUTATION_ENV, "grain")


@pytest.mark.usefixtures("grain_order")
@pytest.mark.parametrize("host", [0, 1])
def test_each_host_reads_grains_batches(host):
    assert [batch["id"].tolist() for batch in pipeline(dl, host)] == GRAIN_IDS[host]


@pytest.mark.usefixtures("grain_order")
def test_a_grain_checkpoint_mid_run_continues_with_grains_next_batch():
    """Grain saves {"next_index": 8 * k} after k batches of this pipeline."""
    it = iter(pipeline(dl, 1))
    it.set_state({"next_index": 8 * 5})
    assert [batch["id"].tolist() for batch in it] == GRAIN_IDS[1][5:]
