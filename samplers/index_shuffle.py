"""``index_shuffle``: Grain's one-index keyed permutation, with Grain's values.

``index_shuffle(index, max_index, seed, rounds)`` is where ``index`` goes under a
permutation of ``[0, max_index]`` keyed by ``seed``, computed alone (no table of the
domain), with Grain's signature and argument checks. The values are Grain's own (its
Simon cipher with cycle walking, :mod:`.grain_permutation`), so code that calls
``grain.experimental.index_shuffle`` gets the same numbers; ``rounds=4`` is the order
of Grain's ``MapDataset.shuffle`` and of ``IndexSampler(permutation="grain")``.

Grain's quirk comes along: for ``max_index = 2**k`` with an even ``k >= 16`` the value
``max_index`` does not fit the cipher's block, so two indices share an image.

Example:
    >>> [index_shuffle(i, max_index=9, seed=5, rounds=8) for i in range(10)]  # as Grain's
    [1, 7, 2, 6, 4, 9, 0, 3, 5, 8]
"""

from __future__ import annotations

import operator

import numpy as np

from .grain_permutation import grain_index_shuffle
from .permutation import MAX_N


def _integer(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"index_shuffle {name} must be an integer, got {value!r} of type {type(value).__name__}")
    return operator.index(value)


def index_shuffle(index: int, max_index: int, seed: int, rounds: int) -> int:
    """The image of ``index`` under the permutation of ``[0, max_index]`` keyed by ``seed``.

    Args:
        index: in ``[0, max_index]``.
        max_index: the largest index, in ``[0, 2**63)``.
        seed: an unsigned 32-bit key, ``[0, 2**32)`` (as Grain's).
        rounds: cipher rounds, an even number in ``[4, 1024]`` (as Grain's).

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
    return int(grain_index_shuffle(np.asarray([index]), max_index, seed, rounds)[0])
