"""The experimental datasets over engine-backed streams: the same output and states for
0, 1 and 2 worker processes (mp_prefetch), and states that restore with another count."""

from __future__ import annotations

import json

import numpy as np
import pytest

import dataloader as dl
from dataloader.experimental import (
    CacheIterDataset,
    ElasticIterator,
    LimitIterDataset,
    PackAndBatchOperation,
    RebatchIterDataset,
    RepeatIterDataset,
    ZipIterDataset,
    ZipMapDataset,
)
from tests.dataloader.dataset.experimental.streams import engine_stream
from tests.helpers import assert_streams_equal, take
from tests.integration.conftest import no_leaks  # noqa: F401  (autouse: no child or block left)

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]


def tokens(x):
    return {"tokens": np.arange(int(x) % 6 + 1) + 10 * int(x)}


def packed():
    stream = dl.MapDataset.range(50).seed(8).shuffle().map(tokens).to_iter_dataset()
    return dl.experimental.ConcatThenSplitIterDataset(stream, length_struct={"tokens": 5})


def select_map():
    return [(i % 2, i // 2) for i in range(30)]


PIPELINES = {
    "limit": lambda: LimitIterDataset(engine_stream(60), 25),
    "repeat": lambda: RepeatIterDataset(engine_stream(20), num_epochs=3),
    "zip": lambda: ZipIterDataset([engine_stream(40), engine_stream(40, seed=2)]),
    "rebatch": lambda: RebatchIterDataset(engine_stream(60).batch(4), 3),
    "cache": lambda: RepeatIterDataset(CacheIterDataset(engine_stream(30)), num_epochs=2),
    "mix": lambda: dl.IterDataset.mix({"plain": engine_stream(80).map(lambda e: e["x"]), "packed": packed()},
                                      weights={"plain": 1, "packed": 2}),
    "zip_map": lambda: ZipMapDataset([dl.MapDataset.range(30).seed(1).shuffle(),
                                      dl.MapDataset.range(30).map(lambda x: x * x)]).to_iter_dataset().batch(4),
    "select": lambda: dl.MapDataset.select_from_datasets(
        [dl.MapDataset.range(15).seed(2).shuffle(), dl.MapDataset.range(100, 115)], select_map()
    ).to_iter_dataset().batch(3),
}


def workers(ds, count):
    return ds.mp_prefetch(dl.MultiprocessingOptions(num_workers=count))


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_the_output_is_the_same_for_0_1_and_2_workers(name):
    runs = [list(workers(PIPELINES[name](), w)) for w in (0, 1, 2)]
    assert runs[0]
    assert_streams_equal(runs[1], runs[0])
    assert_streams_equal(runs[2], runs[0])


@pytest.mark.parametrize("name", ["rebatch", "mix", "cache"])
def test_a_state_saved_with_two_workers_restores_in_process(name):
    with iter(workers(PIPELINES[name](), 2)) as it:
        take(it, 7)
        state = json.dumps(it.get_state())
        rest = list(it)
    restored = iter(PIPELINES[name]())
    restored.set_state(json.loads(state))
    assert_streams_equal(list(restored), rest)


def test_cache_under_mp_prefetch_restarts_as_in_grain():
    """Grain's test_mp_prefetch_in_memory."""
    ds = workers(CacheIterDataset(dl.MapDataset.range(20).to_iter_dataset()), 2)
    with iter(ds) as it:
        state = it.get_state()
        assert list(it) == list(range(20))
        it.set_state(state)
        assert list(it) == list(range(20))


def test_an_elastic_iterator_with_workers_gives_the_in_process_batches():
    ds = dl.MapDataset.range(40).seed(6).shuffle().map(lambda x: x + 1)
    options = dl.MultiprocessingOptions(num_workers=2)
    for shard in (0, 1):
        with ElasticIterator(ds, 8, dl.ShardOptions(shard, 2), multiprocessing_options=options) as it:
            it.start_prefetch()  # the workers start before the first next()
            parallel = take(it, 5)
        assert_streams_equal(parallel, take(ElasticIterator(ds, 8, dl.ShardOptions(shard, 2)), 5))


def pack_and_batch_loader(count):
    return dl.DataLoader(
        dl.RangeDataSource(80),
        dl.IndexSampler(80, shuffle=True, seed=4, num_epochs=1),
        [dl.MapTransform(tokens), PackAndBatchOperation({"tokens": 8}, batch_size=3)],
        worker_count=count,
    )


def test_pack_and_batch_in_a_data_loader_is_the_same_for_0_1_and_2_workers():
    runs = [list(pack_and_batch_loader(w)) for w in (0, 1, 2)]
    assert all(isinstance(b, tuple) and b[0]["tokens"].shape == (3, 8) for b in runs[0])
    assert_streams_equal(runs[1], runs[0])
    assert_streams_equal(runs[2], runs[0])
