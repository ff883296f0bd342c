"""``ElasticIterator``'s IterDataset path: ``get_shard_states`` / ``set_shard_states``.

Streams with a filter, a flat map or a packer, on 2 shards, then 3, then 1: every
record exactly once over the whole run.
"""

from __future__ import annotations

import numpy as np
import pytest

import dataloader as dl
from dataloader.dataset.experimental.elastic import ElasticIterator
from tests.dataloader.dataset.experimental.streams import run_on_shard_counts

N = 61


def keep(x: int) -> bool:
    return x % 3 != 0


def fan_out(x: int) -> list[int]:
    return [x * 10 + k for k in range(x % 3)]


def tokens(x: int) -> dict[str, np.ndarray]:
    return {"tokens": np.full(1 + x % 5, x + 1, dtype=np.int64)}


def stream():
    return dl.MapDataset.range(N).seed(1).shuffle().to_iter_dataset()


CASES = {
    "filter": (lambda: stream().filter(keep), [x for x in range(N) if keep(x)]),
    "flat map": (lambda: stream().flat_map(fan_out), sorted(y for x in range(N) for y in fan_out(x))),
    "first-fit": (
        lambda: dl.experimental.FirstFitPackIterDataset(
            stream().filter(keep).map(tokens), length_struct={"tokens": 8}, num_packing_bins=2),
        [x for x in range(N) if keep(x)],
    ),
    # The iterator-level window shuffle (one window in memory) over a filtered stream.
    "window shuffle": (
        lambda: dl.experimental.WindowShuffleIterDataset(stream().filter(keep), window_size=5, seed=2),
        [x for x in range(N) if keep(x)],
    ),
    "window shuffle, first-fit": (
        lambda: dl.experimental.FirstFitPackIterDataset(
            dl.experimental.WindowShuffleIterDataset(stream().filter(keep).map(tokens), window_size=5, seed=2),
            length_struct={"tokens": 8}, num_packing_bins=2),
        [x for x in range(N) if keep(x)],
    ),
    # A packer over a packer: the outer rows name the inner rows' records (ids per token).
    "first-fit over first-fit": (
        lambda: dl.experimental.FirstFitPackIterDataset(
            dl.experimental.FirstFitPackIterDataset(stream().filter(keep).map(tokens), length_struct={"tokens": 8},
                                                     num_packing_bins=2),
            length_struct={"tokens": 16}, num_packing_bins=2),
        sorted(x for x in range(N) if keep(x) for _ in range(1 + x % 5)),
    ),
    # A map and a filter after the packer: the loader's stage after its packer (on the
    # pool with workers), passing every old state down.
    "map, filter over first-fit": (
        lambda: dl.experimental.FirstFitPackIterDataset(
            stream().filter(keep).map(tokens), length_struct={"tokens": 8}, num_packing_bins=2,
        ).map(same_row).filter(any_row),
        [x for x in range(N) if keep(x)],
    ),
}


def same_row(row):
    return {k: np.asarray(v).copy() for k, v in row.items()}


def any_row(row) -> bool:
    return bool(np.asarray(row["tokens_segment_ids"]).max() > 0)  # every row: rows differ after a restore


def ids(name: str, batch) -> list[int]:
    if name == "first-fit over first-fit":
        tokens = np.asarray(batch["tokens"])
        return [int(t) - 1 for t in tokens[tokens > 0]]  # not the inner rows' padding
    if "first-fit" not in name:
        return np.asarray(batch).reshape(-1).tolist()
    out = []
    for row, seg in zip(batch["tokens"], batch["tokens_segment_ids"]):
        out += [int(row[seg == s][0]) - 1 for s in np.unique(seg[seg > 0])]
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_shard_states_restore_on_other_shard_counts_with_every_record_once(name):
    _restore_on_other_counts(name)


def test_a_map_after_a_packer_on_worker_processes_restores_with_every_record_once():
    from dataloader.engine.stages.shipped import ShippedElementwiseIterator

    it = ElasticIterator(CASES["map, filter over first-fit"][0](), 6, dl.ShardOptions(0, 2),
                         multiprocessing_options=dl.MultiprocessingOptions(num_workers=2))
    stage, kinds = it._inner, []
    while stage is not None:
        kinds.append(type(stage))
        parents = getattr(stage, "_parents", ())
        stage = parents[0] if len(parents) == 1 else None
    it.close()
    assert ShippedElementwiseIterator in kinds  # the map and filter run on the pool
    _restore_on_other_counts("map, filter over first-fit", dl.MultiprocessingOptions(num_workers=2))


def _restore_on_other_counts(name: str, mp=None) -> None:
    make, want = CASES[name]

    def shard(h, count):
        return ElasticIterator(make(), 6, dl.ShardOptions(h, count), multiprocessing_options=mp)

    assert sorted(run_on_shard_counts(shard, lambda out: ids(name, out), [(2, 2), (3, 1), (1, None)])) == want


def test_each_shard_yields_its_share_of_the_global_batch():
    its = [ElasticIterator(CASES["filter"][0](), 6, dl.ShardOptions(h, 3)) for h in range(3)]
    assert [len(next(it)) for it in its] == [2, 2, 2]


def test_get_state_restores_the_same_shard_count():
    it = ElasticIterator(CASES["flat map"][0](), 4, dl.ShardOptions(1, 2))
    next(it)
    state = it.get_state()
    rest = [b.tolist() for b in it]
    again = ElasticIterator(CASES["flat map"][0](), 4, dl.ShardOptions(1, 2))
    again.set_state(state)
    assert [b.tolist() for b in again] == rest


def test_set_shard_states_needs_every_old_shard():
    its = [ElasticIterator(CASES["filter"][0](), 6, dl.ShardOptions(h, 2)) for h in range(2)]
    new = ElasticIterator(CASES["filter"][0](), 6, dl.ShardOptions(0, 3))
    with pytest.raises(dl.StateMismatchError, match=r"one state from each of the old hosts, got shards \[1\]"):
        new.set_shard_states(its[1].get_shard_states())


def test_a_window_shuffles_state_names_the_windows_handed_elements_as_positions():
    it = ElasticIterator(CASES["window shuffle"][0](), 2, dl.ShardOptions(0, 2))
    next(it)
    node = it.get_state()["stages"]["parent"]  # under the batch stage
    assert node["pos_in_window"] == 1 and len(node["used"]) == 1  # one element of its window out
    assert set(node["parent"]) >= {"position", "made_for"}  # the engine's state before the window


def test_a_packer_cutting_another_packers_rows_mid_round_is_refused_at_restore():
    """The outer packer cuts the inner rows into pieces, each holding parts of several
    records: it cannot name them, so a restore on another count says so."""
    ds = dl.experimental.FirstFitPackIterDataset(
        dl.experimental.FirstFitPackIterDataset(stream().map(tokens), length_struct={"tokens": 8},
                                                 num_packing_bins=2),
        length_struct={"tokens": 5}, num_packing_bins=2)
    its = [ElasticIterator(ds, 2, dl.ShardOptions(h, 2)) for h in range(2)]
    for it in its:
        next(it)
    states = {h: s for it in its for h, s in it.get_shard_states().items()}
    with pytest.raises(dl.StateMismatchError, match="does not name as positions"):
        ElasticIterator(ds, 3, dl.ShardOptions(0, 3)).set_shard_states(states)


def test_shard_states_are_keyed_by_shard_index():
    its = [ElasticIterator(CASES["filter"][0](), 6, dl.ShardOptions(h, 3)) for h in range(3)]
    keys = sorted(k for it in its for k in it.get_shard_states())
    assert keys == [0, 1, 2]
