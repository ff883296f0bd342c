"""Grain's shuffle order: the values of grain 0.2.18's index_shuffle and MapDataset.shuffle.

Every golden list below was printed by grain 0.2.18 (``index_shuffle_module.index_shuffle``
and ``grain.MapDataset.range(37).shuffle(seed=5)``); the seed_seq words by a C++ program
calling ``std::seed_seq{seed}.generate`` of libstdc++.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dataloader as dl
from dataloader.samplers.grain_permutation import grain_index_shuffle, grain_permute, seed_seq_words


def test_seed_seq_words_are_the_cpp_standards():
    assert seed_seq_words(0, 4) == (2963817213, 69796629, 1973464570, 532167439)
    assert seed_seq_words(0, 8)[:4] == (1094379501, 3997995638, 44776313, 1411495788)


@pytest.mark.parametrize(("n", "seed", "rounds", "expected"), [
    (10, 0, 4, [0, 4, 6, 7, 8, 3, 1, 9, 5, 2]),
    (17, 7, 8, [3, 1, 9, 10, 16, 0, 6, 14, 2, 11, 13, 12, 4, 15, 7, 8, 5]),
    (100, 2**32 - 1, 4, [56, 72, 71, 29, 62, 80, 52, 8, 7, 27, 57, 69, 47, 33, 12, 26, 19, 86, 53, 42]),
])
def test_index_shuffle_gives_grains_values(n, seed, rounds, expected):
    got = grain_index_shuffle(np.arange(len(expected)), n - 1, seed, rounds)
    assert got.tolist() == expected


def test_index_shuffle_of_huge_domains_gives_grains_values():
    indices = np.asarray([1501134007, 45276086891, 0, 2**40 - 2])
    assert grain_index_shuffle(indices, 2**40 - 2, 1, 4).tolist() == [
        518647431948, 1073356448607, 914914938113, 1046417948936]
    indices = np.asarray([2653223586736784169, 612796136297009145, 0, 2**62 + 10])
    assert grain_index_shuffle(indices, 2**62 + 10, 1, 4).tolist() == [
        1283766253686035923, 395836004917798423, 1994726829303005895, 1999291168902155109]


def test_grains_quirk_at_max_index_two_to_an_even_power_is_kept():
    """max_index = 2**16 does not fit Grain's 16-bit block: it lands where 0 does."""
    got = grain_index_shuffle(np.asarray([0, 1, 2**16 - 1, 2**16]), 2**16, 0, 4)
    assert got.tolist() == [31105, 2851, 45824, 31105]  # grain 0.2.18's values


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 3000), seed=st.integers(0, 2**32 - 1), epoch=st.integers(0, 5))
def test_each_epoch_is_a_permutation_and_single_values_agree(n, seed, epoch):
    order = grain_permute(np.arange(n), n, seed, epoch)
    assert sorted(order.tolist()) == list(range(n))
    picks = np.asarray([n - 1, 0, n // 2])
    assert grain_permute(picks, n, seed, epoch).tolist() == order[picks].tolist()


def test_index_sampler_with_grains_permutation_reads_grains_shuffle_order():
    sampler = dl.IndexSampler(37, shuffle=True, seed=5, permutation="grain")
    keys = sampler.record_keys(np.arange(37 * 3))
    assert keys[:37].tolist() == [  # grain.MapDataset.range(37).shuffle(seed=5), epoch 0
        4, 0, 32, 20, 7, 30, 8, 27, 36, 35, 1, 21, 11, 3, 17, 12, 28, 23, 25, 9, 31, 26, 22, 18, 5,
        24, 2, 10, 34, 29, 19, 13, 33, 14, 6, 16, 15]
    assert keys[37:50].tolist() == [30, 14, 24, 20, 12, 25, 17, 5, 1, 18, 29, 22, 8]  # epoch 1
    assert [sampler[i].record_key for i in (0, 40, 100)] == keys[[0, 40, 100]].tolist()
    many = dl.IndexSampler(3, shuffle=True, seed=5, permutation="grain").record_keys(np.arange(30))
    assert [sorted(many[i : i + 3].tolist()) for i in range(0, 30, 3)] == [[0, 1, 2]] * 10


def test_a_grain_permutation_sampler_shards_and_describes_itself():
    sampler = dl.IndexSampler(100, dl.ShardOptions(1, 2), shuffle=True, seed=9, permutation="grain")
    whole = dl.IndexSampler(100, shuffle=True, seed=9, permutation="grain")
    assert sampler.record_keys(np.arange(50)).tolist() == whole.record_keys(np.arange(1, 100, 2)).tolist()
    assert sampler.with_shard_options(dl.ShardOptions(0, 2)).permutation == "grain"
    assert json.loads(json.dumps(sampler.describe()))["permutation"] == "grain"
    assert "permutation" not in dl.IndexSampler(100, shuffle=True, seed=9).describe()
    assert sampler != dl.IndexSampler(100, dl.ShardOptions(1, 2), shuffle=True, seed=9)
    assert repr(whole).endswith("seed=9, permutation='grain')")
    assert whole.index_map_signature == "permutation=grain"


def test_bad_permutation_arguments_are_refused():
    with pytest.raises(ValueError, match=r"permutation must be one of \['granary', 'grain'\], got 'numpy'"):
        dl.IndexSampler(10, shuffle=True, seed=1, permutation="numpy")
    with pytest.raises(ValueError, match=r"permutation='grain' takes seeds in \[0, 2\*\*32\), as Grain's"):
        dl.IndexSampler(10, shuffle=True, seed=2**32, permutation="grain")


def test_a_loader_state_of_one_permutation_is_refused_by_the_other():
    source = dl.RangeDataSource(0, 20, 1)
    grain_order = dl.DataLoader(data_source=source, sampler=dl.IndexSampler(
        20, shuffle=True, seed=3, permutation="grain", num_epochs=1), worker_count=0)
    it = iter(grain_order)
    first = next(it)
    state = it.get_state()
    ours = iter(dl.DataLoader(data_source=source, sampler=dl.IndexSampler(20, shuffle=True, seed=3, num_epochs=1),
                              worker_count=0))
    with pytest.raises(dl.StateMismatchError, match=r"index_map='permutation=grain' but this loader has index_map=None"):
        ours.set_state(state)
    assert first == grain_index_shuffle(np.asarray([0]), 19, 3, 4)[0]
