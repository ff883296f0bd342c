"""PackAndBatchOperation in pipelines: a DataLoader's operations and the dataset API, restored."""

from __future__ import annotations

import numpy as np
import pytest

import dataloader as dl
from dataloader.dataset.transformations.packing import PackIterDataset
from dataloader.experimental import PackAndBatchOperation
from tests.helpers import assert_restores_everywhere


def tokens(x):
    return {"tokens": np.arange(int(x) % 7 + 1) + 100 * int(x)}


def loader(batch_size=4):
    return dl.DataLoader(
        dl.RangeDataSource(90),
        dl.IndexSampler(90, shuffle=True, seed=2, num_epochs=1),
        [dl.MapTransform(tokens), PackAndBatchOperation({"tokens": 10}, batch_size=batch_size)],
    )


def test_a_data_loader_yields_grains_batches_of_packed_rows():
    batches = list(loader())
    data, segmentations, positions = batches[0]
    assert data["tokens"].shape == segmentations["tokens"].shape == positions["tokens"].shape == (4, 10)
    every = np.concatenate([d["tokens"][s["tokens"] > 0] for d, s, _ in batches])
    assert sorted(every.tolist()) == sorted(t for x in range(90) for t in tokens(x)["tokens"].tolist())


def test_a_data_loader_with_pack_and_batch_restores_at_every_step():
    assert_restores_everywhere(lambda: loader().iterator(), limit=40, fresh_iterator_every=3)


def test_the_dataset_api_packs_the_same_batches():
    stream = dl.MapDataset.range(90).seed(2).shuffle().map(tokens).to_iter_dataset()
    via_dataset = list(PackIterDataset(stream, PackAndBatchOperation({"tokens": 10}, 4)))
    via_loader = list(loader())
    assert len(via_dataset) == len(via_loader)
    for (a, b, c), (x, y, z) in zip(via_dataset, via_loader):
        assert a["tokens"].tolist() == x["tokens"].tolist() and b["tokens"].tolist() == y["tokens"].tolist()
        assert c["tokens"].tolist() == z["tokens"].tolist()


def test_a_state_of_another_batch_size_is_refused():
    it = loader(4).iterator()
    next(it)
    with pytest.raises(dl.StateMismatchError, match=r"PackAndBatchOperation\(\{'tokens': 10\}, batch_size=4\)"):
        loader(3).iterator(it.get_state())
