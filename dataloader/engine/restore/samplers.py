"""Samplers over a selection of another sampler's global order: what a restore reads.

Both are :class:`~dataloader.samplers.Sampler` objects, so filters, flat maps, mixtures,
random maps (keyed by the global position), workers and units run on them unchanged:

* :class:`ElasticSampler`: one host's share of a
  :class:`~dataloader.engine.restore.layout.Layout` (after an elastic restore).
* :class:`StepSampler`: the records of one saved step only (what a fingerprint check
  computes when the step is not a run of this host's own stream).

They share :class:`Reselection`, which declares what the rest of the engine asks of
them: the global order they read (``base``), the layout (None for a step) and what was
used of the outputs at their positions (``local_skips``). The functions at the end
answer those questions for any sampler, a plain one included, by type, never by probing.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dataloader.engine.restore.layout import Layout
from dataloader.samplers import ShardOptions
from dataloader.samplers.view import SamplerView


class Reselection(SamplerView):
    """A sampler view (:class:`~dataloader.samplers.view.SamplerView`) that reads a
    selection of ``base``'s global order (read unsharded).

    Attributes:
        base: the sampler of the global order.
        layout: the :class:`Layout` it reads a share of, or None.
        local_skips: ``(local position, sub) -> None`` (drop that output: it was used
            before the change) or ``{feature: offset}`` (hand out only its rest).
    """

    layout: Layout | None = None

    def __init__(self, base: Any, shard_options: ShardOptions) -> None:
        self.base = base.with_shard_options(ShardOptions(0, 1))
        self.shard_options = shard_options
        self.take_order_of(self.base)
        self.local_skips: dict[tuple[int, int], Any] = {}

    def keys_at(self, global_positions: np.ndarray) -> np.ndarray:
        """The record index at each global position: the base order's."""
        return self.base.record_keys(global_positions)


class ElasticSampler(Reselection):
    """One host's share of a :class:`Layout`: host ``j`` of ``H`` reads ``U[j + H*p]``.

    Args:
        base: the sampler of the global stream's order (any shard options: it is read
            unsharded), e.g. an ``IndexSampler`` or a mixture's.
        layout: what is still to be read.
        shard_options: which share this host reads.
    """

    def __init__(self, base: Any, layout: Layout, shard_options: ShardOptions) -> None:
        if shard_options.drop_remainder:
            raise ValueError(
                f"elastic restore needs shard_options with drop_remainder=False, got "
                f"{shard_options}: the positions a host count drops at the end differ by host count"
            )
        super().__init__(base, shard_options)
        self.layout = self._layout = layout
        j, count = shard_options.shard_index, shard_options.shard_count
        total = layout.size(self.base.num_positions)
        self._num_positions = None if total is None else max(0, -(-(total - j) // count))
        for (g, sub), used in layout.partial.items():
            i = layout.index_of(g)
            if i % count == j:
                self.local_skips[i // count, sub] = used

    @property
    def num_positions(self) -> int | None:
        return self._num_positions

    def global_positions(self, positions: Any) -> np.ndarray:
        """The global position of each local position (int64, same shape)."""
        array = np.asarray(positions, dtype=np.int64)
        flat = array.reshape(-1)
        if len(flat) and (flat.min() < 0 or (self._num_positions is not None and flat.max() >= self._num_positions)):
            raise IndexError(
                f"positions {flat.min()}..{flat.max()} outside this host's stream of "
                f"{self._num_positions} positions"
            )
        count, j = self.shard_options.shard_count, self.shard_options.shard_index
        return self._layout.at(j + count * flat).reshape(array.shape)

    def with_shard_options(self, shard_options: ShardOptions) -> ElasticSampler:
        """The same layout, read as the share ``shard_options``."""
        return ElasticSampler(self.base, self._layout, shard_options)

    def __repr__(self) -> str:
        return f"ElasticSampler({self.base!r}, layout={self._layout.describe()}, shard_options={self.shard_options!r})"


class StepSampler(Reselection):
    """A sampler over one saved step's records only: local position ``i`` is its
    ``i``-th record, at its global position (so random maps draw the same numbers).
    What an executor computes to check a step the iterator's own stream does not hold
    (an old host's state, in an elastic restore).

    Args:
        base: the sampler of the global order (read unsharded).
        positions: the step's global positions.
    """

    def __init__(self, base: Any, positions: np.ndarray) -> None:
        super().__init__(base, ShardOptions(0, 1))
        self._positions = np.asarray(positions, dtype=np.int64)

    @property
    def num_positions(self) -> int:
        return len(self._positions)

    def global_positions(self, positions: Any) -> np.ndarray:
        return self._positions[np.asarray(positions, dtype=np.int64)]

    def with_shard_options(self, shard_options: ShardOptions) -> StepSampler:
        return self


def order_of(sampler: Any) -> Any:
    """The sampler of the global order ``sampler`` reads (itself, unless it reselects)."""
    return sampler.base if isinstance(sampler, Reselection) else sampler


def layout_of(sampler: Any) -> Layout | None:
    """The layout an elastic restore gave ``sampler`` (None: the plain sharding)."""
    return sampler.layout if isinstance(sampler, Reselection) else None


def skips_of(sampler: Any) -> dict[tuple[int, int], Any]:
    """What was used of the outputs at ``sampler``'s positions (empty: nothing)."""
    return sampler.local_skips if isinstance(sampler, Reselection) else {}
