"""Dataset pipelines covering every transformation, shared by the dataset tests.

Functions live at module level so worker processes can import them; each builder is
named for what it exercises and returns an ``IterDataset``.
"""

from __future__ import annotations

import dataloader as dl
from tests.dataloader.pipelines import add_noise, as_dict, keep_not_multiple_of_3


def negate(x):
    return {"x": -x["x"]}


def odd_first(x):
    return int(x["x"][0]) % 2 == 1


def _range(start, stop):
    return dl.MapDataset.range(start, stop).map(as_dict)


def endless_mix():
    """0.3/0.7 of two shuffled, endlessly repeated ranges (an ``IndexMapSampler``)."""
    a = _range(0, 10).seed(1).shuffle().repeat()
    b = _range(100, 105).seed(2).shuffle().repeat()
    return dl.MapDataset.mix([a, b], [0.3, 0.7])


DATASETS = {
    "source": lambda: _range(0, 23).to_iter_dataset(),
    "shuffle": lambda: _range(0, 23).seed(7).shuffle().to_iter_dataset(),
    "shuffle_repeat": lambda: _range(0, 7).seed(7).shuffle().repeat(3).to_iter_dataset(),
    "repeat_forever": lambda: _range(0, 7).seed(7).shuffle().repeat().to_iter_dataset(),
    "repeat_then_shuffle": lambda: _range(0, 7).repeat(3).seed(7).shuffle().to_iter_dataset(),
    "slice": lambda: _range(0, 30).seed(7).shuffle()[3:25:2].repeat(2).to_iter_dataset(),
    "map_then_shuffle": lambda: _range(0, 23).map(negate).seed(7).shuffle().to_iter_dataset(),
    "random_map": lambda: _range(0, 23).seed(7).shuffle().random_map(add_noise).to_iter_dataset(),
    "filter": lambda: _range(0, 23).filter(keep_not_multiple_of_3).to_iter_dataset(),
    "batch": lambda: _range(0, 23).seed(7).shuffle().repeat(2).batch(4).to_iter_dataset(),
    "batch_drop_remainder": lambda: _range(0, 23).batch(4, drop_remainder=True).repeat(2).to_iter_dataset(),
    "batch_then_shuffle": lambda: _range(0, 23).batch(4).seed(1).shuffle().repeat(2).to_iter_dataset(),
    "batch_and_pad": lambda: _range(0, 10).repeat(3).batch_and_pad(4).to_iter_dataset(),
    "concatenate": lambda: dl.MapDataset.concatenate(
        [_range(0, 5), _range(10, 17).seed(2).shuffle()]
    ).repeat(3).to_iter_dataset(),
    "mix": lambda: endless_mix().to_iter_dataset(),
    "mix_with_component_ops": lambda: dl.MapDataset.mix(
        [_range(0, 9).map(negate).repeat(), _range(50, 60).filter(odd_first).seed(4).shuffle().repeat()],
        [1, 2],
    ).to_iter_dataset().batch(3),
    "iter_map": lambda: _range(0, 23).seed(7).shuffle().to_iter_dataset().map(negate),
    "iter_filter_batch": lambda: _range(0, 23).seed(7).shuffle().repeat(2).to_iter_dataset()
    .filter(keep_not_multiple_of_3).batch(4),
    "iter_random_map_after_batch": lambda: _range(0, 23).seed(7).shuffle().to_iter_dataset()
    .batch(3).random_map(lambda b, rng: {**b, "r": rng.random()}),
    "iter_mix": lambda: dl.IterDataset.mix(
        [_range(0, 6).repeat().to_iter_dataset().map(negate),
         _range(20, 30).seed(3).shuffle().repeat().to_iter_dataset().filter(odd_first)],
        [0.5, 0.5],
    ).seed(5).random_map(add_noise).batch(2),
    "thread_prefetch": lambda: _range(0, 23).seed(7).shuffle().batch(4).to_iter_dataset().prefetch(3),
    "sharded_mix": lambda: endless_mix().to_iter_dataset(shard_options=dl.ShardOptions(2, 3)).batch(2),
    "sharded": lambda: _range(0, 23).seed(7).shuffle().repeat(2).to_iter_dataset(
        shard_options=dl.ShardOptions(1, 3)
    ).batch(2),
}


def everything_chained(workers: int = 0) -> dl.IterDataset:
    """Map, filter, random map and batch over a shuffled multi-epoch source."""
    return (
        dl.MapDataset.source(dl.RangeDataSource(23)).seed(7).shuffle().repeat(3)
        .map(as_dict)
        .to_iter_dataset()
        .filter(keep_not_multiple_of_3)
        .random_map(add_noise)
        .batch(4)
        .mp_prefetch(dl.MultiprocessingOptions(num_workers=workers))
    )


def everything_loader() -> dl.DataLoader:
    """The same pipeline written for ``DataLoader``."""
    return dl.DataLoader(
        dl.RangeDataSource(23),
        dl.IndexSampler(23, shuffle=True, seed=7, num_epochs=3),
        [dl.MapTransform(as_dict), dl.FilterTransform(keep_not_multiple_of_3),
         dl.RandomMapTransform(add_noise), dl.Batch(4)],
    )
