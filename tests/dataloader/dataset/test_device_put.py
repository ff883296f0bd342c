"""device_put: the device feed of the dataset API is the loader's device queue."""

from __future__ import annotations

import numpy as np

import dataloader as dl
from tests.dataloader.pipelines import as_dict


def test_device_put_yields_device_arrays_and_the_state_of_the_last_batch_handed_out():
    import jax

    ds = dl.MapDataset.range(20).seed(1).shuffle().map(as_dict).batch(4).to_iter_dataset()
    host = list(ds)
    with dl.device_put(ds, jax.devices("cpu")[0], cpu_buffer_size=3, device_buffer_size=2) as it:
        first = next(it)
        state = it.get_state()
        assert isinstance(first["x"], jax.Array)
        assert np.asarray(first["x"]).tolist() == host[0]["x"].tolist()  # int32 without x64
        assert state["position"] == 4
        it.set_state(state)
        assert np.asarray(next(it)["x"]).tolist() == host[1]["x"].tolist()


def test_device_put_accepts_a_map_dataset():
    out = [np.asarray(b).tolist() for b in dl.device_put(dl.MapDataset.range(6).batch(3))]
    assert out == [[0, 1, 2], [3, 4, 5]]
