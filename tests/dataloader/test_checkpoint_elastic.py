"""An Orbax restore on another process count hands a loader's iterator every old
process's file, so any pipeline restores elastically (here without a JAX cluster: the
restore of one process is called with its index and count)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import dataloader as dl
from dataloader import checkpoint
from dataloader.dataset.experimental.elastic import ElasticIterator
from dataloader.engine.restore.protocol import takes_every_host
from tests.dataloader.engine.elastic_cases import make_loader, record_ids, reference


def _write(directory, states):
    for i, state in enumerate(states):
        (directory / checkpoint.state_filename(i, len(states))).write_text(json.dumps(state))


@pytest.mark.parametrize("name", ["filter", "first-fit", "concat-then-split"])
def test_a_new_process_count_restores_from_every_process_file(tmp_path, name):
    old = [iter(make_loader(name, h, 2)) for h in range(2)]
    used = [i for it in old for _ in range(3) for i in record_ids(name, next(it))]
    _write(tmp_path, [it.get_state() for it in old])
    for h in range(3):
        it = iter(make_loader(name, h, 3))
        assert checkpoint._restore_item(tmp_path, it, h, 3) is it
        used += [i for out in it for i in record_ids(name, out)]
    assert sorted(used) == reference(name)


def test_the_same_process_count_restores_from_its_own_file(tmp_path):
    old = [iter(make_loader("filter", h, 2)) for h in range(2)]
    for it in old:
        next(it)
    _write(tmp_path, [it.get_state() for it in old])
    it = iter(make_loader("filter", 1, 2))
    checkpoint._restore_item(tmp_path, it, 1, 2)
    assert [record_ids("filter", b) for b in it] == [record_ids("filter", b) for b in old[1]]


def test_an_iterator_that_does_not_take_every_state_reads_process_0(tmp_path):
    ds = dl.MapDataset.range(24).seed(0).shuffle()
    old = [ElasticIterator(ds, 6, dl.ShardOptions(h, 2)) for h in range(2)]
    for it in old:
        next(it)
    _write(tmp_path, [it.get_state() for it in old])
    new = ElasticIterator(ds, 6, dl.ShardOptions(0, 3))
    assert not takes_every_host(new)
    checkpoint._restore_item(tmp_path, new, 0, 3)
    assert new.get_state()["global_next_index"] == 6


def test_elastic_iterators_iterdataset_path_restores_from_every_file(tmp_path):
    def make(h, count):
        stream = dl.MapDataset.range(40).seed(0).shuffle().to_iter_dataset().filter(lambda x: x % 4 != 0)
        return ElasticIterator(stream, 6, dl.ShardOptions(h, count))

    old = [make(h, 2) for h in range(2)]
    used = [x for it in old for x in np.asarray(next(it)).tolist()]
    _write(tmp_path, [it.get_state() for it in old])
    for h in range(3):
        it = make(h, 3)
        checkpoint._restore_item(tmp_path, it, h, 3)
        used += [x for b in it for x in np.asarray(b).tolist()]
    assert sorted(used) == [x for x in range(40) if x % 4 != 0]


def test_the_device_feed_over_a_loader_restores_from_every_process_file(tmp_path):
    old = [iter(make_loader("flat map", h, 2)) for h in range(2)]
    used = [i for it in old for _ in range(2) for i in record_ids("flat map", next(it))]
    _write(tmp_path, [it.get_state() for it in old])
    for h in range(3):
        with dl.device_prefetch(make_loader("flat map", h, 3).iterator()) as it:
            assert takes_every_host(it)
            checkpoint._restore_item(tmp_path, it, h, 3)
            used += [i for b in it for i in record_ids("flat map", np.asarray(b))]
    assert sorted(used) == reference("flat map")


def _padded_loader(h, count):
    return dl.DataLoader(dl.RangeDataSource(11), dl.IndexSampler(11, dl.ShardOptions(h, count), num_epochs=1),
                         [dl.MapTransform(lambda x: {"x": np.int64(x)}), dl.Batch(2)], end="pad")


def test_an_end_pad_loader_restores_from_every_process_file(tmp_path):
    """``end="pad"`` on 2 processes (host 0 reads 6 records, host 1 five: its last batch
    is padded), saved after 2 steps, restored by Orbax on 1 and 3 processes: every
    record once, and the new processes run the same number of steps."""
    old = [iter(_padded_loader(h, 2)) for h in range(2)]
    batches = [next(it) for it in old for _ in range(2)]
    _write(tmp_path, [it.get_state() for it in old])
    for count in (1, 3):
        used = [int(x) for b in batches for x in b["x"][b["mask"]]]
        steps = set()
        for h in range(count):
            it = _padded_loader(h, count).iterator()
            assert checkpoint._restore_item(tmp_path, it, h, count) is it
            rest = list(it)
            steps.add(len(rest))
            used += [int(x) for b in rest for x in b["x"][b["mask"]]]
        assert sorted(used) == list(range(11)), count
        assert len(steps) == 1, count
