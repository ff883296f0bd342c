"""States of Grain's dataset iterators restore into granary where the continuation is exact.

Every state and every "Grain's next outputs" list below was produced by grain 0.2.18
(/work/ext/grainvenv): the same chain built with ``grain.MapDataset`` and
``permutation=...`` left out, ``it = iter(ds)``, ``k`` outputs read with ``next(it)``,
then ``it.get_state()`` and the next outputs (``.tolist()`` for batches).
``mp_prefetch`` ran with ``grain.MultiprocessingOptions(num_workers=1)`` (and 2).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import dataloader as dl

MD = dl.MapDataset
G = "grain"
MP2_STATE = {
    "next_index_in_cycle": 1, "next_index_in_datasets": 2, "iterators_in_use_indices": [0, 1],
    "iterators_in_use_states": [{"next_index": 12}, {"next_index": 8}], "exhausted": [0, 0],
    "future_states": {},
}


def maxtext_like():
    """MaxText's shuffled ArrayRecord pipeline, shaped: source, shuffle, repeat, shard by
    slicing, to_iter_dataset, batch."""
    return MD.range(50).shuffle(seed=11, permutation=G).repeat(2)[0::1].to_iter_dataset().batch(4)


CASES = {
    "plain": (lambda: MD.range(50).to_iter_dataset(), {"next_index": 20}, [20, 21, 22]),
    "shuffled": (lambda: MD.range(50).shuffle(seed=11, permutation=G).repeat(2).to_iter_dataset(),
                 {"next_index": 20}, [12, 5, 19]),
    "seeded_map": (lambda: MD.range(50).seed(3).shuffle(permutation=G).map(lambda x: x * 2).to_iter_dataset(),
                   {"next_index": 7}, [38, 48, 0]),
    "maxtext_batched": (maxtext_like, {"next_index": 20},
                        [[12, 5, 19, 32], [9, 20, 24, 43], [23, 8, 39, 35]]),
    "map_batched": (lambda: MD.range(50).to_iter_dataset().map(lambda x: x + 1).batch(4, drop_remainder=True),
                    {"next_index": 12}, [[13, 14, 15, 16], [17, 18, 19, 20], [21, 22, 23, 24]]),
    "read_options": (lambda: MD.range(50).to_iter_dataset(dl.ReadOptions(num_threads=2, prefetch_buffer_size=4)),
                     {"next_index": 9}, [9, 10, 11]),
    "filtered": (lambda: MD.range(50).filter(lambda x: x % 3 != 0).to_iter_dataset(),
                 {"next_index": 14}, [14, 16, 17]),
    "iter_filter": (lambda: MD.range(50).to_iter_dataset().filter(lambda x: x % 3 != 0),
                    {"next_index": 14}, [14, 16, 17]),
    "filter_batch": (lambda: MD.range(50).filter(lambda x: x % 3 != 0).to_iter_dataset().batch(4),
                     {"next_index": 18}, [[19, 20, 22, 23]]),
    "batched_map_dataset": (lambda: MD.range(50).batch(4).to_iter_dataset(), {"next_index": 3},
                            [[12, 13, 14, 15]]),
    "thread_prefetch": (lambda: dl.experimental.ThreadPrefetchIterDataset(MD.range(50).to_iter_dataset(),
                                                                         prefetch_buffer_size=3),
                        {"next_index": 9}, [9, 10, 11]),
    "mp_prefetch_one_worker": (
        lambda: maxtext_like().mp_prefetch(dl.MultiprocessingOptions(num_workers=1)),
        {"next_index_in_cycle": 0, "next_index_in_datasets": 1, "iterators_in_use_indices": [0],
         "iterators_in_use_states": [{"next_index": 20}], "exhausted": [0], "future_states": {}},
        [[12, 5, 19, 32], [9, 20, 24, 43], [23, 8, 39, 35]],
    ),
}


def head(iterator, count):
    out = []
    for x in iterator:
        out.append(x.tolist() if hasattr(x, "tolist") else x)
        if len(out) == count:
            break
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_grain_state_continues_with_grains_next_outputs(name):
    build, state, grains_next = CASES[name]
    it = iter(build())
    it.set_state(state)
    assert head(it, len(grains_next)) == grains_next


def test_json_text_of_a_grain_state_restores_too():
    it = iter(maxtext_like())
    it.set_state(json.dumps({"next_index": 20}))
    assert head(it, 1) == [[12, 5, 19, 32]]


def test_the_orbax_handler_restores_a_grain_dataset_state(tmp_path):
    (tmp_path / "process_0-of-1.json").write_text(json.dumps({"next_index": 20}))
    it = dl.PyGrainCheckpointHandler().restore(tmp_path, iter(maxtext_like()))
    assert head(it, 2) == [[12, 5, 19, 32], [9, 20, 24, 43]]


def test_granarys_shuffle_order_refuses_a_grain_state():
    it = iter(MD.range(50).shuffle(seed=11).repeat(2).to_iter_dataset())
    with pytest.raises(dl.StateMismatchError, match=(
        r"Grain dataset-iterator state .*this pipeline shuffles in granary's .* "
        r"shuffle\(\.\.\., permutation='grain'\), or set GRANARY_PERMUTATION=grain")):
        it.set_state({"next_index": 20})


def test_a_window_shuffle_refuses_a_grain_state():
    ds = dl.experimental.WindowShuffleMapDataset(MD.range(50), window_size=8, seed=1).to_iter_dataset()
    with pytest.raises(dl.StateMismatchError, match=r"or window-shuffles"):
        iter(ds).set_state({"next_index": 20})


def test_several_mp_prefetch_workers_are_refused():
    it = iter(maxtext_like().mp_prefetch(dl.MultiprocessingOptions(num_workers=2)))
    try:
        with pytest.raises(dl.StateMismatchError, match=r"saved under mp_prefetch with 2 workers.*order depends on the worker count"):
            it.set_state(MP2_STATE)
    finally:
        it.close()


def test_a_grain_stage_with_state_of_its_own_is_refused():
    it = iter(MD.range(50).to_iter_dataset())
    with pytest.raises(dl.StateMismatchError, match=r"holds more than an index"):
        it.set_state({"next_index": 3, "packer": {"bins": []}})


def test_sharding_by_shard_options_is_refused():
    it = iter(MD.range(50).to_iter_dataset(shard_options=dl.ShardOptions(0, 2)))
    with pytest.raises(dl.StateMismatchError, match=r"sharded by shard_options \(0 of 2, interleaved\).*ds\[h::H\]"):
        it.set_state({"next_index": 4})


def test_a_shuffle_inside_a_batched_source_is_judged_too():
    """``shuffle().batch(4).repeat(2)`` reads the batches as a source of their own: its
    shuffle still decides whether Grain's index order holds."""
    ours = iter(MD.range(50).shuffle(seed=1).batch(4).repeat(2).to_iter_dataset())
    with pytest.raises(dl.StateMismatchError, match=r"shuffles in granary's"):
        ours.set_state({"next_index": 3})
    grains = iter(MD.range(50).shuffle(seed=1, permutation=G).batch(4).repeat(2).to_iter_dataset())
    whole = head(iter(MD.range(50).shuffle(seed=1, permutation=G).batch(4).repeat(2).to_iter_dataset()), 5)
    grains.set_state({"next_index": 3})
    assert head(grains, 2) == whole[3:5]


def test_a_grain_packed_state_is_refused_by_name_not_with_a_key_error():
    """Grain 0.2.18 saves ``{"parent": {"next_index": 34}, "next_row": 0, "counter": 20}``
    for MaxText's first-fit packed pipeline (packer, a map, a batch: the map and the
    batch keep their parent's state). granary's stages say it is Grain's and why they
    cannot continue it, where a KeyError came out before."""
    ds = MD.range(200).map(lambda i: {"x": np.arange(1 + i % 5)}).to_iter_dataset()
    ds = dl.experimental.FirstFitPackIterDataset(ds, length_struct={"x": 8}, num_packing_bins=2)
    ds = ds.map(lambda row: row).batch(2)
    it = iter(ds)
    with pytest.raises(dl.StateMismatchError, match=r"a state written by Grain .*next_index.*restore the run with Grain"):
        it.set_state({"parent": {"next_index": 34}, "next_row": 0, "counter": 20})
