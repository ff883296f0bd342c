"""Stateless samplers: position in a shard's stream -> record index, in O(1).

For ``n`` records the global stream has positions ``g = 0, 1, 2, ...``; position
``g`` lies in epoch ``g // n`` at offset ``g % n`` and reads record
``permute(offset, n, seed, epoch)`` when shuffling, else record ``offset``. Shard
``h`` of ``H`` reads global position ``p * H + h`` at its local position ``p``
(see sharding.py). Nothing here keeps state, so any position can be asked for at
any time, in any order, from any process, and gets the same answer.

Example:
    >>> sampler = IndexSampler(num_records=5, shuffle=True, seed=3, num_epochs=2)
    >>> len(sampler)
    10
    >>> keys = sampler.record_keys(range(10)).tolist()
    >>> sorted(keys[:5]) == sorted(keys[5:]) == [0, 1, 2, 3, 4]
    True
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np

from .grain_permutation import grain_permute
from .key_blocks import KeyBlocks
from .metadata import RecordMetadata
from .permutation import MAX_N, _permute_epochs_unchecked, _permute_one, _permute_unchecked
from .sharding import NoSharding, ShardOptions, shard_length

_INT64_MAX = 2**63 - 1
# Up to this many epochs in one call are permuted one epoch at a time; more (a
# small data set) go through the per-value-key path in one pass.
_FEW_EPOCHS = 4
# The orders a shuffling sampler can read epochs in (see IndexSampler's permutation).
PERMUTATIONS = ("granary", "grain")
PERMUTATION_ENV = "GRANARY_PERMUTATION"
"""The environment variable that picks the order of shuffles built without an explicit
``permutation`` (``MapDataset.shuffle``): unset or ``granary``, or ``grain``."""


def choose_permutation(permutation: str | None = None) -> str:
    """``permutation`` checked, or when ``None`` the process-wide default:
    ``$GRANARY_PERMUTATION``, ``"granary"`` when unset.

    Read when a dataset is built, so code that cannot be edited (a pipeline written for
    Grain) gets Grain's order from ``GRANARY_PERMUTATION=grain`` or
    ``install_grain_alias(permutation="grain")``.

    Raises:
        ValueError: the argument, or the variable, names no order.
    """
    if permutation is None:
        value = os.environ.get(PERMUTATION_ENV, "") or "granary"
        where = f"{PERMUTATION_ENV}={value!r}"
    else:
        value, where = permutation, f"permutation={permutation!r}"
    if value not in PERMUTATIONS:
        raise ValueError(
            f"{where} names no shuffle order; expected one of {list(PERMUTATIONS)} ('grain' for "
            f"Grain's order, 'granary' or unset for granary's)"
        )
    return value


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _type_error(name: str, value: object, expected: str, hint: str) -> TypeError:
    return TypeError(
        f"{name} must be {expected}, got {value!r} of type {type(value).__name__}; {hint}"
    )


class IndexSampler:
    """Maps local positions of one shard's stream to record indices.

    The sampler is immutable, picklable and cheap to copy; equal samplers (by
    :meth:`describe`) produce the same stream.

    Args:
        num_records: Number of records in the data source (``len(source)``).
        shard_options: Which shard of the global stream to read; ``None`` means
            :class:`~samplers.sharding.NoSharding`.
        shuffle: Whether each epoch reads the records in its own pseudo-random
            order (a global shuffle over the whole data set).
        num_epochs: Number of passes over the data set, or ``None`` to repeat for
            ever.
        seed: Non-negative integer below ``2**63``. Keys the shuffle and the
            per-record random generators (:attr:`RecordMetadata.rng`); needed when
            ``shuffle`` is true.
        permutation: ``"granary"`` (default: our keyed Feistel network, see
            :mod:`.permutation`) or ``"grain"``: each epoch in the order of Grain's
            ``MapDataset.shuffle(seed)`` (:mod:`.grain_permutation`; the seed must then
            be below ``2**32``, as Grain's). A state records which one it was made for.

    Raises:
        TypeError: If an argument has the wrong type.
        ValueError: If an argument is out of range, or ``shuffle`` has no seed.

    Example:
        >>> sampler = IndexSampler(num_records=4, num_epochs=1)
        >>> [sampler[i].record_key for i in range(len(sampler))]
        [0, 1, 2, 3]
    """

    num_records: int
    shard_options: ShardOptions
    shuffle: bool
    num_epochs: int | None
    seed: int | None
    permutation: str
    # Part of the Sampler protocol: None says the fields above describe the order.
    index_map_signature: str | None = None
    # Derived at construction: shard index and count, stream length, and the
    # first local position past the end (or past the int64 limit when infinite).
    _shuffle_seed: int  # seed, or 0 when there is none (then shuffle is false)
    _grain: bool  # permutation == "grain"
    _index: int
    _count: int
    _num_positions: int | None
    _end: int
    _blocks: KeyBlocks  # shuffled keys of the last few blocks of positions (a cache)

    def __init__(
        self,
        num_records: int,
        shard_options: ShardOptions | None = None,
        shuffle: bool = False,
        num_epochs: int | None = None,
        seed: int | None = None,
        permutation: str = "granary",
    ) -> None:
        if not _is_int(num_records):
            raise _type_error("num_records", num_records, "an int", "pass len(data_source)")
        num_records = int(num_records)
        if not 1 <= num_records <= MAX_N:
            raise ValueError(
                f"num_records must be in [1, 2**63], got {num_records}; an empty data source has nothing to sample"
            )
        if shard_options is None:
            shard_options = NoSharding()
        if not isinstance(shard_options, ShardOptions):
            raise _type_error(
                "shard_options",
                shard_options,
                "a ShardOptions",
                "pass e.g. ShardOptions(shard_index=0, shard_count=1) or None",
            )
        if not isinstance(shuffle, bool):
            raise _type_error("shuffle", shuffle, "a bool", "pass True or False")
        if num_epochs is not None:
            if not _is_int(num_epochs):
                raise _type_error(
                    "num_epochs",
                    num_epochs,
                    "an int or None",
                    "pass a positive number of epochs, or None to repeat for ever",
                )
            num_epochs = int(num_epochs)
            if num_epochs < 1:
                raise ValueError(
                    f"num_epochs must be positive or None, got {num_epochs}; pass None to repeat for ever"
                )
            if num_records * num_epochs > _INT64_MAX + 1:
                raise ValueError(
                    f"num_records * num_epochs = {num_records} * {num_epochs} exceeds 2**63 global positions; "
                    "pass fewer epochs, or num_epochs=None"
                )
        if seed is not None:
            if not _is_int(seed):
                raise _type_error(
                    "seed", seed, "an int or None", "pass a non-negative integer seed"
                )
            seed = int(seed)
            if not 0 <= seed <= _INT64_MAX:
                raise ValueError(
                    f"seed must be in [0, 2**63), got {seed}; pass a non-negative integer seed"
                )
        if shuffle and seed is None:
            raise ValueError("shuffle=True needs an integer seed, got None; pass seed=...")
        if permutation not in PERMUTATIONS:
            raise ValueError(
                f"permutation must be one of {list(PERMUTATIONS)}, got {permutation!r}; pass "
                f"'grain' for Grain's shuffle order"
            )
        if permutation == "grain" and seed is not None and seed >= 2**32:
            raise ValueError(
                f"permutation='grain' takes seeds in [0, 2**32), as Grain's shuffle does, got {seed}"
            )
        self._set(
            num_records=num_records,
            shard_options=shard_options,
            shuffle=shuffle,
            num_epochs=num_epochs,
            seed=seed,
        )
        index, count = shard_options.shard_index, shard_options.shard_count
        if num_epochs is None:
            # Infinite stream: stop where the global position would overflow int64.
            num_positions, end = None, (_INT64_MAX - index) // count + 1
        else:
            total = num_records * num_epochs
            num_positions = shard_length(total, index, count, shard_options.drop_remainder)
            end = num_positions
        grain = permutation == "grain"
        self._set(
            permutation=permutation,
            _grain=grain,
            # the fields above do not say which network orders the records: a state does
            index_map_signature=f"permutation={permutation}" if grain and shuffle else None,
            _shuffle_seed=seed or 0,
            _index=index,
            _count=count,
            _num_positions=num_positions,
            _end=end,
        )
        self._set(_blocks=KeyBlocks(self._block_keys, end))

    def _set(self, **attributes: Any) -> None:
        for name, value in attributes.items():
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(
            f"{type(self).__name__} is immutable, cannot set {name!r}; build a new sampler (see with_shard_options)"
        )

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable, cannot delete {name!r}")

    @property
    def num_positions(self) -> int | None:
        """Length of this shard's stream, or ``None`` if it repeats for ever."""
        return self._num_positions

    def __len__(self) -> int:
        """Length of this shard's stream; ``sys.maxsize`` when it repeats for ever."""
        return sys.maxsize if self._num_positions is None else self._num_positions

    def _positions(self, positions: Any) -> tuple[np.ndarray, int, int]:
        """Returns ``positions`` as a flat int64 array with its minimum and maximum."""
        array = np.asarray(positions)
        if array.dtype != np.int64:
            if array.dtype.kind not in "iu":
                raise TypeError(
                    f"positions must be integers, got an array of dtype {array.dtype}; pass e.g. np.arange(start, stop)"
                )
            array = array.astype(np.int64)
        flat = array.reshape(-1)
        if not flat.size:
            return flat, 0, -1
        low, high = int(flat.min()), int(flat.max())
        if low < 0:
            raise IndexError(f"position {low} is negative; positions start at 0")
        if high >= self._end:
            raise IndexError(self._past_end("position", high))
        return flat, low, high

    def _past_end(self, name: str, position: int) -> str:
        if self._num_positions is None:
            return f"{name} {position} is too large: its global position would not fit in int64 (limit {self._end - 1})"
        return f"{name} {position} is out of range for a shard stream of length {self._num_positions}; stop at len(sampler)"

    def global_positions(self, positions: Any) -> np.ndarray:
        """Returns the global positions ``p * shard_count + shard_index`` (int64)."""
        flat, _, _ = self._positions(positions)
        return (flat * self._count + self._index).reshape(np.shape(positions))

    def record_keys(self, positions: Any) -> np.ndarray:
        """Returns the record index read at each local position (vectorised).

        The hot path: the loader calls it once per work unit. A shuffled stream's keys
        are computed a block of 1,024 positions at a time and kept for the next units
        (:mod:`.key_blocks`: a permutation call costs about the same for 8 positions
        as for a block). Positions within one epoch (the usual case) take one call to
        the permutation; a block that straddles a few epoch boundaries takes one call
        per epoch; one spanning many epochs (a tiny data set) takes one call with a key
        per position.

        Args:
            positions: Integer array-like of local positions in
                ``[0, num_positions)``, any shape and order.

        Returns:
            An int64 array of record indices with the shape of ``positions``.

        Raises:
            IndexError: If a position is negative or past the end of the stream.
            TypeError: If ``positions`` are not integers.
        """
        flat, low, high = self._positions(positions)
        shape = np.shape(positions)
        if not flat.size:
            return np.empty(shape, dtype=np.int64)
        if self.shuffle:
            keys = self._blocks.keys(flat, low, high)
            if keys is not None:
                return keys.reshape(shape)
        return self._keys(flat, low, high).reshape(shape)

    def _keys(self, flat: np.ndarray, low: int, high: int) -> np.ndarray:
        """The keys of the valid positions ``flat`` (in ``[low, high]``), computed now."""
        n, count, index = self.num_records, self._count, self._index
        global_ = flat * count + index if count != 1 else flat
        first, last = (low * count + index) // n, (high * count + index) // n
        if first == last:
            offsets = global_ - first * n if first else global_
            if not self.shuffle:
                # Never hand back (a view of) the caller's own array.
                return offsets.copy() if offsets is flat else offsets
            return self._permute(offsets, first)
        epochs, offsets = np.divmod(global_, n)
        if not self.shuffle:
            return offsets
        if last - first >= _FEW_EPOCHS and not self._grain:
            return _permute_epochs_unchecked(offsets, epochs, n, self._shuffle_seed)
        # A run that straddles an epoch boundary or two: one call per epoch keeps
        # the fast single-key path (measured ~2x faster than per-value keys).
        keys = np.empty_like(offsets)
        for epoch in range(first, last + 1):
            where = np.flatnonzero(epochs == epoch)
            if where.size:
                keys[where] = self._permute(offsets[where], epoch)
        return keys

    def _block_keys(self, positions: np.ndarray) -> np.ndarray:
        return self._keys(positions, int(positions[0]), int(positions[-1]))

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["_blocks"]  # a cache, made anew where the sampler is unpickled
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._set(**state)
        self._set(_blocks=KeyBlocks(self._block_keys, self._end))

    def _permute(self, offsets: np.ndarray, epoch: int) -> np.ndarray:
        """Offsets of one epoch through the sampler's permutation (validated input)."""
        if self._grain:
            return grain_permute(offsets, self.num_records, self._shuffle_seed, epoch)
        return _permute_unchecked(offsets, self.num_records, self._shuffle_seed, epoch)

    def __getitem__(self, index: int) -> RecordMetadata:
        """Returns the metadata of local position ``index``.

        Raises:
            IndexError: If ``index`` is negative or past the end of the stream.
            TypeError: If ``index`` is not an integer.
        """
        if not _is_int(index):
            raise _type_error("index", index, "an int", "pass a local position 0, 1, 2, ...")
        index = int(index)
        if index < 0:
            raise IndexError(
                f"index {index} is negative; samplers are indexed from 0 (no negative indexing)"
            )
        if index >= self._end:
            raise IndexError(self._past_end("index", index))
        position = index * self._count + self._index
        epoch, offset = divmod(position, self.num_records)
        key = offset
        if self.shuffle and self._grain:
            key = int(grain_permute(np.asarray([offset]), self.num_records, self._shuffle_seed, epoch)[0])
        elif self.shuffle:
            key = _permute_one(offset, self.num_records, self._shuffle_seed, epoch)
        return RecordMetadata(
            index=index, record_key=key, epoch=epoch, global_position=position, seed=self.seed
        )

    def with_shard_options(self, shard_options: ShardOptions) -> IndexSampler:
        """Returns a sampler like this one that reads the shard ``shard_options``."""
        return IndexSampler(
            self.num_records, shard_options, self.shuffle, self.num_epochs, self.seed,
            permutation=self.permutation,
        )

    def describe(self) -> dict[str, Any]:
        """Returns a JSON-able dict of everything that determines the stream."""
        described = {
            "kind": type(self).__name__,
            "num_records": self.num_records,
            "shuffle": self.shuffle,
            "seed": self.seed,
            "num_epochs": self.num_epochs,
            "shard_index": self._index,
            "shard_count": self._count,
            "drop_remainder": self.shard_options.drop_remainder,
        }
        if self._grain:  # only then, so the default's description is as it always was
            described["permutation"] = self.permutation
        return described

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_records={self.num_records}, shard_options={self.shard_options!r}, "
            f"shuffle={self.shuffle}, num_epochs={self.num_epochs}, seed={self.seed}"
            + (f", permutation={self.permutation!r})" if self._grain else ")")
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, IndexSampler):
            return NotImplemented
        return self.describe() == other.describe()

    def __hash__(self) -> int:
        return hash(tuple(self.describe().items()))


class SequentialSampler(IndexSampler):
    """Reads the records once, in order.

    An :class:`IndexSampler` with ``shuffle=False`` and ``num_epochs=1``; the seed
    only keys the per-record random generators.

    Example:
        >>> SequentialSampler(3).record_keys([0, 1, 2]).tolist()
        [0, 1, 2]
    """

    def __init__(
        self, num_records: int, shard_options: ShardOptions | None = None, seed: int | None = None
    ) -> None:
        super().__init__(num_records, shard_options, shuffle=False, num_epochs=1, seed=seed)

    def with_shard_options(self, shard_options: ShardOptions) -> SequentialSampler:
        """Returns a sampler like this one that reads the shard ``shard_options``."""
        return SequentialSampler(self.num_records, shard_options, self.seed)

    def __repr__(self) -> str:
        return f"SequentialSampler(num_records={self.num_records}, shard_options={self.shard_options!r}, seed={self.seed})"
