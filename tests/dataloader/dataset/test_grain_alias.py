"""Code written for Grain runs on granary under ``import dataloader as grain``.

The code below follows Grain's JAX training guide (docs/tutorials/jax_training_tutorial:
the minimal pipeline, ThreadPrefetchIterDataset with a device_put map, the two-stage
``grain.experimental.device_put``, a sharded batch), with an in-memory source standing
in for the guide's MNIST. The Grain-style examples of docs/dataset-api.md run under
``import dataloader as grain`` too.
"""

from __future__ import annotations

import functools
import pathlib
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

import dataloader as grain
from tests.helpers import REPO_ROOT
from tests.test_docs import environment, expected_prints

SOURCE = [{"image": np.full((4, 4, 1), i % 256, np.uint8), "label": i % 10} for i in range(512)]


def preprocess(r):
    return {"image": r["image"].astype(np.float32) / 255.0, "label": r["label"]}


def test_the_minimal_pipeline_of_grains_jax_guide():
    ds = (grain.MapDataset.source(SOURCE).seed(42).shuffle().map(preprocess)
          .batch(batch_size=128, drop_remainder=True).to_iter_dataset())
    batch = jax.device_put(next(iter(ds)))
    shapes = jax.tree.map(lambda x: (x.shape, x.dtype), batch)
    assert shapes["image"] == ((128, 4, 4, 1), np.float32)


def test_repeat_before_batch_makes_an_endless_dataset_of_static_shapes():
    ds = (grain.MapDataset.source(SOURCE).seed(42).shuffle().repeat().map(preprocess)
          .batch(128, drop_remainder=True))
    assert len(ds) == sys.maxsize
    assert ds[7]["image"].shape == (128, 4, 4, 1)


def test_custom_collation_and_batch_and_pad_of_the_guide():
    def pad_collate(items):
        max_len = max(x["tokens"].shape[0] for x in items)
        return {"tokens": np.stack([np.pad(x["tokens"], (0, max_len - x["tokens"].shape[0])) for x in items])}

    ragged = grain.MapDataset.source([{"tokens": np.arange(2 + i % 4)} for i in range(16)])
    ragged = ragged.batch(4, batch_fn=pad_collate, drop_remainder=True)
    assert [ragged[i]["tokens"].shape for i in range(3)] == [(4, 5), (4, 5), (4, 5)]
    padded = grain.MapDataset.range(1, 5).batch(3, batch_fn=functools.partial(grain.experimental.batch_and_pad, batch_size=3))
    assert [b.tolist() for b in padded] == [[1, 2, 3], [4, 0, 0]]


def test_thread_prefetch_then_device_put_map_of_the_guide():
    ds = (grain.MapDataset.source(SOURCE).seed(42).shuffle().map(preprocess)
          .batch(128, drop_remainder=True).to_iter_dataset())
    ds = grain.experimental.ThreadPrefetchIterDataset(ds, prefetch_buffer_size=4)
    ds = ds.map(jax.device_put)
    steps = [(step, batch["image"].shape) for step, batch in zip(range(3), ds)]
    assert steps == [(0, (128, 4, 4, 1)), (1, (128, 4, 4, 1)), (2, (128, 4, 4, 1))]


def test_two_stage_device_put_and_a_sharded_batch_of_the_guide():
    devices = jax.devices()
    mesh = jax.sharding.Mesh(np.array(devices), axis_names=("data",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    ds = (grain.MapDataset.source(SOURCE).seed(42).shuffle().repeat().map(preprocess)
          .batch(128, drop_remainder=True).to_iter_dataset())
    ds = grain.experimental.device_put(ds=ds, device=sharding, cpu_buffer_size=4, device_buffer_size=2)

    @jax.jit
    def train_step(params, batch):
        return params + batch["image"].mean()

    params = jax.numpy.zeros(())
    for _, batch in zip(range(3), ds):
        assert batch["image"].sharding == sharding
        params = train_step(params, batch)
    assert float(params) > 0
    ds.close()


def test_grains_module_names_resolve():
    assert grain.transforms.Map is grain.MapTransform and grain.transforms.Batch is grain.Batch
    assert grain.sharding.ShardOptions is grain.ShardOptions
    assert grain.samplers.IndexSampler is grain.IndexSampler
    assert grain.sources.ArrayRecordDataSource is grain.ArrayRecordDataSource


def _dataset_api_blocks() -> list[str]:
    """The blocks of the dataset API's page; each writes the data it reads."""
    text = (pathlib.Path(REPO_ROOT) / "docs" / "dataset-api.md").read_text()
    return re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(300)
@pytest.mark.parametrize("number", range(len(_dataset_api_blocks())))
def test_the_docs_grain_style_examples_run_as_grain_code(number, tmp_path):
    block = _dataset_api_blocks()[number]
    assert "import dataloader as dl" in block
    as_grain = block.replace("import dataloader as dl", "import dataloader as grain")
    as_grain = re.sub(r"(?<![\w.])dl\.", "grain.", as_grain)
    script = tmp_path / "grain_code.py"
    script.write_text(as_grain)
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=environment(),
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines() == expected_prints(block)
