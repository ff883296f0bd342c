"""Keys computed a block of positions at a time are the keys computed position by
position (samplers/key_blocks.py, behind IndexSampler and the dataset's IndexMapSampler)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dataloader as dl
from dataloader.samplers import IndexSampler, ShardOptions
from dataloader.samplers.key_blocks import BLOCK, KeyBlocks

FAST = settings(max_examples=60, deadline=None)


def runs(draw: st.DrawFn, length: int) -> list[np.ndarray]:
    """Unit-like queries: short runs of consecutive positions (some straddling a block
    boundary), a few scattered sets, and one wide span, in the order drawn."""
    queries = []
    for _ in range(draw(st.integers(1, 6))):
        start = draw(st.integers(0, max(length - 1, 0)))
        size = draw(st.integers(1, 40))
        queries.append(np.arange(start, min(start + size, length), dtype=np.int64))
    scattered = draw(st.lists(st.integers(0, length - 1), min_size=1, max_size=20))
    queries.append(np.asarray(scattered, dtype=np.int64))
    queries.append(np.arange(0, length, max(1, length // 7), dtype=np.int64))
    return queries


@st.composite
def samplers_and_queries(draw: st.DrawFn) -> tuple[IndexSampler, list[np.ndarray]]:
    n = draw(st.integers(1, 3 * BLOCK))
    permutation = draw(st.sampled_from(["granary", "grain"]))
    seed = draw(st.integers(0, 2**32 - 1))
    count = draw(st.integers(1, 4))
    epochs = draw(st.sampled_from([1, 3, None]))
    sampler = IndexSampler(n, ShardOptions(draw(st.integers(0, count - 1)), count), shuffle=True,
                           num_epochs=epochs, seed=seed, permutation=permutation)
    length = sampler.num_positions or 4 * n + 3 * BLOCK
    return sampler, runs(draw, length)


@FAST
@given(samplers_and_queries())
def test_an_index_samplers_blocks_give_each_positions_own_key(case):
    sampler, queries = case
    for positions in queries:
        expected = [sampler[int(p)].record_key for p in positions]  # the scalar path: no blocks
        assert sampler.record_keys(positions).tolist() == expected


@st.composite
def trees_and_queries(draw: st.DrawFn) -> tuple[dl.MapDataset, list[np.ndarray]]:
    n = draw(st.integers(1, 2 * BLOCK))
    ds = dl.MapDataset.range(n).shuffle(seed=draw(st.integers(0, 2**32 - 1)))
    if draw(st.booleans()):
        ds = dl.MapDataset.mix([ds, dl.MapDataset.range(7).shuffle(seed=3)], [0.75, 0.25])
    hosts = draw(st.integers(1, 3))
    ds = ds.repeat(draw(st.sampled_from([2, None])))[draw(st.integers(0, hosts - 1))::hosts]
    length = len(ds) if len(ds) < 2**40 else 5 * n + 2 * BLOCK
    return ds, runs(draw, length)


@FAST
@given(trees_and_queries())
def test_a_dataset_samplers_blocks_give_what_its_index_tree_gives(case):
    ds, queries = case
    sampler = ds.to_iter_dataset().loader.plan.sampler
    for positions in queries:
        direct = sampler.index.keys(sampler.global_positions(positions))
        assert sampler.record_keys(positions).tolist() == direct.tolist()


def test_a_block_is_computed_once_for_the_units_it_serves():
    calls = []

    def compute(positions):
        calls.append((int(positions[0]), len(positions)))
        return positions * 3

    blocks = KeyBlocks(compute, end=2 * BLOCK + 5)
    for start in range(0, 2 * BLOCK + 5, 8):
        stop = min(start + 8, 2 * BLOCK + 5)
        positions = np.arange(start, stop)
        assert blocks.keys(positions, start, stop - 1).tolist() == (positions * 3).tolist()
    assert calls == [(0, BLOCK), (BLOCK, BLOCK), (2 * BLOCK, 5)]


def test_a_span_wider_than_two_blocks_is_left_to_the_caller():
    blocks = KeyBlocks(lambda p: p, end=10 * BLOCK)
    assert blocks.keys(np.array([0, 3 * BLOCK]), 0, 3 * BLOCK) is None


@pytest.mark.parametrize("make", [
    lambda: IndexSampler(5000, shuffle=True, seed=4, num_epochs=None),
    lambda: dl.MapDataset.range(5000).shuffle(seed=4).repeat(None).to_iter_dataset().loader.plan.sampler,
], ids=["IndexSampler", "IndexMapSampler"])
def test_a_pickled_sampler_leaves_its_blocks_behind_and_gives_the_same_keys(make):
    sampler = make()
    before = sampler.record_keys(np.arange(100, 140))
    copy = pickle.loads(pickle.dumps(sampler))
    assert len(pickle.dumps(sampler)) < 4096, "no block of keys travels with the sampler"
    assert copy.record_keys(np.arange(100, 140)).tolist() == before.tolist()
