"""What a sampler says about one position of the stream, and per-record randomness.

Random operations must give the same result for a record whatever the number of
workers, the prefetch depth, the number of hosts or a restore from a checkpoint.
So a record's generator is a pure function of ``(seed, global_position)``, never a
generator that is advanced as records go by: :func:`record_rng` builds a
counter-based ``numpy.random.Philox`` whose key comes from ``(seed, stream)`` and
whose counter starts at ``(global_position, sub_index)``. Building one takes a few
microseconds; :class:`RecordMetadata` carries one when its sampler has a seed.

Example:
    >>> a = record_rng(seed=7, global_position=3).integers(0, 100, size=4)
    >>> b = record_rng(seed=7, global_position=3).integers(0, 100, size=4)
    >>> bool((a == b).all())
    True
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

# Domain separation from the permutation keys (see permutation.py), which are also
# derived from the user's seed through SeedSequence.
_RNG_TAG = 0x524E4721  # "RNG!"
_WORD = 2**64


def _check_word(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(
            f"{name} must be an int, got {value!r} of type {type(value).__name__}; pass a non-negative integer"
        )
    if not 0 <= value < _WORD:
        raise ValueError(f"{name} must be in [0, 2**64), got {value}; pass a non-negative integer")


@functools.lru_cache(maxsize=256)
def _philox_key(seed: int, stream: int) -> np.ndarray:
    """Returns the 128-bit Philox key of ``(seed, stream)`` as two uint64 words."""
    sequence = np.random.SeedSequence(seed, spawn_key=(_RNG_TAG, stream))
    key = sequence.generate_state(2, dtype=np.uint64)
    key.setflags(write=False)
    return key


def record_rng(
    seed: int | None, global_position: int, stream: int = 0, sub_index: int = 0
) -> np.random.Generator:
    """Returns the random generator of one record of the global stream.

    The generator is a pure function of the four arguments. Generators of
    different positions, streams or sub-indices do not overlap: Philox's 256-bit
    counter holds ``global_position`` and ``sub_index`` in its two high words and
    counts draws in the two low words (2**128 blocks per record).

    Args:
        seed: The sampler's seed. ``None`` is refused: without a seed there is no
            reproducible randomness to give.
        global_position: The record's position ``g`` in the global stream (not its
            record key, so that a record seen again in a later epoch draws anew).
        stream: Separates independent uses of randomness for the same record (say
            one per random operation of a pipeline).
        sub_index: Separates the elements that one position produces (say after a
            flat map).

    Returns:
        A fresh ``numpy.random.Generator`` backed by ``numpy.random.Philox``.

    Raises:
        ValueError: If ``seed`` is None, or an argument is outside ``[0, 2**64)``.
        TypeError: If an argument is not an integer.
    """
    if seed is None:
        raise ValueError("per-record random generators need a seed; pass seed=... to the sampler")
    for name, value in (
        ("seed", seed),
        ("global_position", global_position),
        ("stream", stream),
        ("sub_index", sub_index),
    ):
        _check_word(name, value)
    counter = np.array([0, 0, global_position, sub_index], dtype=np.uint64)
    bit_generator = np.random.Philox(key=_philox_key(int(seed), int(stream)), counter=counter)
    return np.random.Generator(bit_generator)


@dataclasses.dataclass(frozen=True, slots=True)
class RecordMetadata:
    """One position of a shard's stream and the record it reads (Grain's fields first).

    ``RecordMetadata(index, record_key=None, rng=None)`` as in Grain; a sampler also
    fills the keyword-only ``epoch``, ``global_position`` and ``seed``, and then ``rng``
    is ``record_rng(seed, global_position)`` when not given (``None`` without a seed).

    Attributes:
        index: Local position in this shard's stream (0, 1, 2, ...).
        record_key: Index of the record in the data source.
        rng: The record's random generator (not compared).
        epoch: Epoch of the position, ``global_position // num_records``.
        global_position: Position in the global (unsharded) stream.
        seed: The sampler's seed, or ``None`` if it has none.

    Example:
        >>> meta = RecordMetadata(index=0, record_key=5, epoch=0, global_position=0, seed=1)
        >>> bool(meta.rng.integers(0, 10) == record_rng(1, 0).integers(0, 10))
        True
        >>> RecordMetadata(3).rng is None
        True
    """

    index: int
    record_key: int | None = None
    rng: np.random.Generator | None = dataclasses.field(default=None, compare=False)
    epoch: int | None = dataclasses.field(default=None, kw_only=True)
    global_position: int | None = dataclasses.field(default=None, kw_only=True)
    seed: int | None = dataclasses.field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        if self.rng is None and self.seed is not None and self.global_position is not None:
            object.__setattr__(self, "rng", record_rng(self.seed, self.global_position))


class RecordRngFactory:
    """Hands out the generators of :func:`record_rng` for one ``(seed, stream)``, fast.

    Building a ``Philox`` costs ~8 us; this factory keeps one bit generator and resets
    its state for each record (~1 us), so the draws equal ``record_rng``'s exactly. The
    generator returned is reused by the next call: use it within the call it was
    given to (as a random map does), never keep it.

    Example:
        >>> rngs = RecordRngFactory(seed=1, stream=2)
        >>> float(rngs(10).random()) == float(record_rng(1, 10, 2).random())
        True
    """

    def __init__(self, seed: int | None, stream: int = 0) -> None:
        if seed is None:
            raise ValueError(
                "per-record random generators need a seed; pass seed=... to the sampler"
            )
        _check_word("seed", seed)
        _check_word("stream", stream)
        key = _philox_key(int(seed), int(stream))
        self._bits = np.random.Philox(key=key)
        self._generator = np.random.Generator(self._bits)
        self._state = self._bits.state
        self._inner = self._state["state"]

    def __call__(self, global_position: int, sub_index: int = 0) -> np.random.Generator:
        _check_word("global_position", global_position)
        _check_word("sub_index", sub_index)
        self._inner["counter"] = np.array([0, 0, global_position, sub_index], dtype=np.uint64)
        # The rest of the state (an empty buffer, no cached 32-bit half) is as built.
        self._bits.state = self._state
        return self._generator
