"""index_shuffle: Grain's signature, checks, properties (a bijection of [0, max_index]) and values.

The golden values come from grain 0.2.18 (/work/ext/grainvenv):
``grain._src.python.experimental.index_shuffle.python.index_shuffle_module.index_shuffle``
called with the arguments written beside each list.
"""

from __future__ import annotations

import numpy as np
import pytest

from dataloader.samplers import IndexSampler
from dataloader.samplers.index_shuffle import index_shuffle


def test_it_is_a_permutation_of_zero_to_max_index():
    """Grain's test_index_shuffle."""
    max_index = 46_204
    seen = {index_shuffle(x, max_index, seed=52, rounds=4) for x in range(max_index + 1)}
    assert seen == set(range(max_index + 1))


def test_huge_domains_stay_in_range_and_distinct():
    max_index = 1_234_567_891
    out = [index_shuffle(x, max_index, seed=27, rounds=4) for x in range(10_000)]
    assert len(set(out)) == 10_000 and min(out) >= 0 and max(out) <= max_index


def test_a_single_record():
    assert index_shuffle(index=0, max_index=0, seed=0, rounds=4) == 0


def test_values_are_grains():
    assert [index_shuffle(i, max_index=9, seed=5, rounds=8) for i in range(10)] == [1, 7, 2, 6, 4, 9, 0, 3, 5, 8]
    huge = [index_shuffle(i, max_index=1_234_567_891, seed=27, rounds=4) for i in (0, 1, 2, 10**9)]
    assert huge == [103931463, 222438862, 118128102, 172033472]
    # 2**40 does not fit Grain's 40-bit block: it is read as 0, as in Grain
    edge = [index_shuffle(i, max_index=2**40, seed=2**32 - 1, rounds=12) for i in (0, 5, 2**40)]
    assert edge == [552129838714, 563396334336, 552129838714]


def test_four_rounds_are_the_grain_samplers_order():
    n = 1000
    ours = [index_shuffle(i, n - 1, seed=7, rounds=4) for i in range(n)]
    grain_order = IndexSampler(n, shuffle=True, seed=7, num_epochs=1, permutation="grain")
    assert ours == grain_order.record_keys(np.arange(n)).tolist()


def test_seeds_and_rounds_give_different_orders():
    orders = {tuple(index_shuffle(i, 99, seed=s, rounds=r) for i in range(100)) for s in (1, 2) for r in (4, 8)}
    assert len(orders) == 4


@pytest.mark.parametrize("rounds", [2, 5, 1025, 1026, 4294967294])
def test_rounds_must_be_even_and_between_4_and_1024(rounds):
    with pytest.raises(ValueError, match=rf"rounds must be an even integer between 4 and 1024, but got rounds = {rounds}"):
        index_shuffle(index=0, max_index=8, seed=33, rounds=rounds)


@pytest.mark.parametrize("index", [-1, 9])
def test_the_index_must_be_in_range(index):
    with pytest.raises(ValueError, match=rf"index must be in \[0, max_index\], but got index = {index}"):
        index_shuffle(index=index, max_index=8, seed=33, rounds=4)


def test_seeds_are_unsigned_32_bit_and_arguments_are_integers():
    with pytest.raises(ValueError, match=r"seed must be an unsigned 32-bit integer, .* got seed = 4294967296"):
        index_shuffle(0, 8, seed=2**32, rounds=4)
    with pytest.raises(TypeError, match=r"index_shuffle max_index must be an integer, got 8.0"):
        index_shuffle(0, 8.0, seed=1, rounds=4)
    assert index_shuffle(np.int64(3), np.int32(8), np.uint32(1), 4) == index_shuffle(3, 8, 1, 4)
