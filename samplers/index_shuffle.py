"""``index_shuffle``: Grain's one-index keyed permutation, on our Feistel network.

``index_shuffle(index, max_index, seed, rounds)`` is where ``index`` goes under a
permutation of ``[0, max_index]`` keyed by ``seed``, computed alone in O(rounds) (no
table), with Grain's signature and argument checks. It is the network of
:func:`~.permutation.permute` (mixed-radix Feistel with cycle walking) with ``rounds``
rounds: for ``rounds=12`` it is exactly ``permute(index, max_index + 1, seed, epoch=0)``,
the order of ``IndexSampler(shuffle=True, seed=seed)``'s first epoch. The values differ
from Grain's (another network, another key schedule); the properties (a bijection,
a pure function of its arguments) are the same.

Example:
    >>> sorted(index_shuffle(i, max_index=9, seed=5, rounds=8) for i in range(10))
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
"""

from __future__ import annotations

import functools
import operator

import numpy as np

from .permutation import _KEY_TAG, MAX_N, ROUNDS, _mix64, _permute_one_keyed, _round_keys_int


def _integer(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"index_shuffle {name} must be an integer, got {value!r} of type {type(value).__name__}")
    return operator.index(value)


@functools.lru_cache(maxsize=256)
def _keys(seed: int, rounds: int) -> tuple[int, ...]:
    """``rounds`` round keys of ``seed``; the first 12 are ``permute``'s keys of epoch 0."""
    if rounds == ROUNDS:
        return _round_keys_int(seed, 0)
    words = np.random.SeedSequence(seed, spawn_key=(_KEY_TAG,)).generate_state(rounds, np.uint64)
    # permute's key of epoch e is mix64(s_i + mix64(e * golden)); for e = 0 that is mix64(s_i).
    return tuple(int(k) for k in _mix64(words))


def index_shuffle(index: int, max_index: int, seed: int, rounds: int) -> int:
    """The image of ``index`` under the permutation of ``[0, max_index]`` keyed by ``seed``.

    Args:
        index: in ``[0, max_index]``.
        max_index: the largest index, in ``[0, 2**63)``.
        seed: an unsigned 32-bit key, ``[0, 2**32)`` (as Grain's).
        rounds: Feistel rounds, an even number in ``[4, 1024]`` (as Grain's).

    Raises:
        TypeError: an argument that is not an integer.
        ValueError: an argument out of its range.
    """
    index, max_index = _integer("index", index), _integer("max_index", max_index)
    seed, rounds = _integer("seed", seed), _integer("rounds", rounds)
    if rounds < 4 or rounds % 2 or rounds > 1024:
        raise ValueError(f"rounds must be an even integer between 4 and 1024, but got rounds = {rounds}")
    if not 0 <= max_index < MAX_N:
        raise ValueError(f"max_index must be in [0, 2**63), but got max_index = {max_index}")
    if not 0 <= index <= max_index:
        raise ValueError(
            f"index must be in [0, max_index], but got index = {index} and max_index = {max_index}"
        )
    if not 0 <= seed < 2**32:
        raise ValueError(f"seed must be an unsigned 32-bit integer, in [0, 2**32), but got seed = {seed}")
    return _permute_one_keyed(index, max_index + 1, _keys(seed, rounds))
