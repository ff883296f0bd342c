"""Bucketing by length on the stream: the batches tf.data's bucket_by_sequence_length
makes, restored exactly at every step, the same for every worker count, and the same
whether written as a dataset call, a DataLoader operation or a YAML entry."""

from __future__ import annotations

import numpy as np
import pytest

import dataloader as dl
from dataloader.config.pipeline import parse_config
from dataloader.operations import BucketByLength
from tests.helpers import assert_restores_everywhere, assert_streams_equal

LENGTHS = np.random.default_rng(3).integers(1, 30, size=200)
BUCKETS = {"element_length_func": "tokens", "bucket_boundaries": [8, 16], "bucket_batch_sizes": [4, 3, 2]}


def tokens(i):
    """Record ``i``: a sequence of a stored length whose tokens say where it came from."""
    n = int(LENGTHS[int(i) % len(LENGTHS)])
    return {"tokens": np.arange(n, dtype=np.int32) + 1000 * int(i) + 1}


def stream(workers=0):
    return (dl.MapDataset.range(len(LENGTHS)).seed(5).shuffle().map(tokens).to_iter_dataset()
            .mp_prefetch(dl.MultiprocessingOptions(num_workers=workers)))


def test_batches_are_tf_datas_buckets_in_order():
    """Lengths 1,5,2,7,3,3,8,1,2 with boundaries [3, 6] and batches of 2: a bucket is
    handed out when full; at the end the partial buckets follow in bucket order."""
    lengths = [1, 5, 2, 7, 3, 3, 8, 1, 2]
    ds = dl.MapDataset.source(lengths).map(lambda n: np.arange(n)).to_iter_dataset()
    got = [[len(row[row > 0]) + 1 for row in batch] for batch in ds.bucket_by_length(len, [3, 6], [2, 2, 2])]
    assert got == [[1, 2], [5, 3], [7, 8], [1, 2], [3]]


def test_drop_remainder_drops_the_partial_buckets_at_the_end():
    ds = dl.MapDataset.source([1, 5, 2, 7]).map(lambda n: np.arange(n)).to_iter_dataset()
    assert [b.shape[0] for b in ds.bucket_by_length(len, [3, 6], [2, 2, 2], drop_remainder=True)] == [2]


def test_every_element_is_in_exactly_one_batch():
    batches = list(stream().bucket_by_length(**BUCKETS))
    firsts = sorted(int(row[0]) // 1000 for b in batches for row in b["tokens"])
    assert firsts == list(range(len(LENGTHS)))


@pytest.mark.parametrize("drop", [False, True])
def test_bucketed_batches_restore_at_every_step(drop):
    ds = stream().bucket_by_length(**BUCKETS, drop_remainder=drop)
    assert_restores_everywhere(lambda: iter(ds), limit=90, fresh_iterator_every=3)


def test_the_state_is_small_and_refused_by_another_bucketing():
    it = iter(stream().bucket_by_length(**BUCKETS))
    for _ in range(10):
        next(it)
    state = it.get_state()
    assert len(state["waiting"]) < sum(BUCKETS["bucket_batch_sizes"])
    other = iter(stream().bucket_by_length("tokens", [8, 17], [4, 3, 2]))
    with pytest.raises(dl.StateMismatchError, match=r"saved by the bucketing"):
        other.set_state(state)


def loader(workers=0):
    return dl.DataLoader(
        dl.RangeDataSource(len(LENGTHS)),
        dl.IndexSampler(len(LENGTHS), shuffle=True, seed=5, num_epochs=1),
        [dl.MapTransform(tokens), BucketByLength(**BUCKETS)],
        worker_count=workers,
    )


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_a_data_loader_buckets_the_same_for_0_1_and_2_workers_and_restores():
    runs = [list(loader(w)) for w in (0, 1, 2)]
    assert_streams_equal(runs[0], runs[1])
    assert_streams_equal(runs[0], runs[2])
    assert_restores_everywhere(lambda: iter(loader(2)), limit=40, fresh_iterator_every=10)


def test_a_yaml_entry_builds_the_same_loader():
    config = parse_config({
        "source": {"kind": "dataloader.sources.RangeDataSource", "options": {"start": len(LENGTHS)}},
        "sampler": {"shuffle": True, "seed": 5},
        "operations": [
            {"map": "tests.dataloader.dataset.test_bucket.tokens"},
            {"bucket_by_length": BUCKETS},
        ],
    })
    assert_streams_equal(list(config.build_loader()), list(loader()))


def test_a_yaml_entry_names_a_missing_argument():
    with pytest.raises(dl.ConfigError, match=r"bucket_by_length.*bucket_batch_sizes"):
        parse_config({"source": {"kind": "dataloader.sources.RangeDataSource", "options": {"start": 4}},
                      "operations": [{"bucket_by_length": {"element_length_func": "t", "bucket_boundaries": [2]}}]})
