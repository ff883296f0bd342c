"""The sampler protocol: what the loader's engine reads from a sampler.

A sampler maps local positions of one shard's stream to record indices, statelessly, so
that any position can be computed in O(1), in any process, in any order.
:class:`~.index_sampler.IndexSampler` is the one to use; the dataset API compiles its
chains (mixtures, slices, concatenations) to samplers of its own that follow the same
protocol.

Example:
    >>> from dataloader.samplers import IndexSampler, Sampler
    >>> isinstance(IndexSampler(10, num_epochs=1), Sampler)
    True
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

from .sharding import ShardOptions


@runtime_checkable
class Sampler(Protocol):
    """Positions of a shard's stream -> record indices, in O(1), without state.

    Obligations the protocol cannot check: ``record_keys`` is a pure function of the
    positions (same answer in every process, whatever was asked before), vectorised,
    and raises ``IndexError`` for a position outside ``[0, num_positions)``; the
    sampler is picklable and immutable.

    Attributes:
        num_records: records of the data source the stream draws from.
        shuffle: whether the order is shuffled (recorded in states).
        seed: the seed of the shuffle and of random maps, or None.
        num_epochs: passes over the records, None for an endless stream.
        shard_options: which shard of the global stream this sampler reads.
        num_positions: the length of this shard's stream, None when endless.
        index_map_signature: None for an ``IndexSampler`` (its fields describe the
            order); a short text naming the order otherwise, recorded in states so
            that a state of another order is refused.
    """

    num_records: int
    shuffle: bool
    seed: int | None
    num_epochs: int | None
    shard_options: ShardOptions
    index_map_signature: str | None

    @property
    def num_positions(self) -> int | None: ...

    def record_keys(self, positions: Any) -> np.ndarray:
        """The record index at each local position (int64, the shape of ``positions``)."""
        ...

    def global_positions(self, positions: Any) -> np.ndarray:
        """The global position (before sharding) of each local position."""
        ...

    def with_shard_options(self, shard_options: ShardOptions) -> Sampler:
        """The same order, read as the shard ``shard_options``."""
        ...


def missing_members(sampler: Any) -> list[str]:
    """The members of :class:`Sampler` that ``sampler`` lacks (empty when it has all)."""
    members = [*Sampler.__annotations__, "num_positions", "record_keys",
               "global_positions", "with_shard_options"]
    return [name for name in members if not hasattr(sampler, name)]
