"""One base for the samplers that read an order through another: :class:`SamplerView`.

Every sampler but :class:`~.index_sampler.IndexSampler` is a view: its local positions
are global positions of some order (a shard's share of a mixture's stream, one host's
share of what an elastic restore left, one saved step's records, the elements of an
iterated stream), and the record key at a global position comes from that order. A view
answers those two questions, :meth:`~SamplerView.global_positions` and
:meth:`~SamplerView.keys_at`; the :class:`~.protocol.Sampler` protocol's
:meth:`~SamplerView.record_keys` is written once here, from them.

:class:`ElementOrder` is the simplest view, the order of an iterated stream: position
``p`` is element ``p``. The other views live where their orders are built (the dataset
API's index trees, the engine's restore), since an order is that layer's concept.

Example:
    >>> ElementOrder().record_keys([[0, 1], [5, 6]]).tolist()
    [[0, 1], [5, 6]]
"""

from __future__ import annotations

import abc
from typing import Any

import numpy as np

from .sharding import ShardOptions


class SamplerView(abc.ABC):
    """A :class:`~.protocol.Sampler` that reads local positions through a global order.

    A subclass sets the protocol's attributes (``num_records``, ``shuffle``, ``seed``,
    ``num_epochs``, ``shard_options``, ``index_map_signature``; :meth:`take_order_of`
    copies them from another sampler) and implements the three abstract methods.
    """

    def take_order_of(self, order: Any) -> None:
        """Copies what a state records of an order from the sampler ``order`` (a view
        over another sampler reads that sampler's records, seeded as it is)."""
        self.num_records = order.num_records
        self.shuffle = order.shuffle
        self.seed = order.seed
        self.num_epochs = order.num_epochs
        self.index_map_signature = order.index_map_signature

    @property
    @abc.abstractmethod
    def num_positions(self) -> int | None:
        """The length of this view's stream, None when endless."""

    @abc.abstractmethod
    def global_positions(self, positions: Any) -> np.ndarray:
        """The global position of each local position (int64, the shape of ``positions``);
        ``IndexError`` for a position outside the view."""

    @abc.abstractmethod
    def keys_at(self, global_positions: np.ndarray) -> np.ndarray:
        """The record key at each global position (a flat int64 array in, the same out)."""

    @abc.abstractmethod
    def with_shard_options(self, shard_options: ShardOptions) -> SamplerView:
        """The same order, read as the shard ``shard_options``."""

    def record_keys(self, positions: Any) -> np.ndarray:
        """The record key at each local position (int64, the shape of ``positions``)."""
        glob = np.asarray(self.global_positions(positions), dtype=np.int64)
        return np.asarray(self.keys_at(glob.reshape(-1)), dtype=np.int64).reshape(glob.shape)


class ElementOrder(SamplerView):
    """The order of an iterated stream: position ``p`` is the stream's element ``p``.

    Endless (the upstream ends the stream) and unshuffled: the positions are the keys
    of the random generators, as for the same operations run element by element. What
    the engine's pool computes units of when it runs operations over an
    ``IterDataset``'s elements (a shipped stage).
    """

    num_records = 0
    shuffle = False
    seed = None
    num_epochs = None
    shard_options = ShardOptions(0, 1)
    index_map_signature = "elements of an iterated stream"

    @property
    def num_positions(self) -> None:
        return None

    def global_positions(self, positions: Any) -> np.ndarray:
        return np.asarray(positions, dtype=np.int64)

    def keys_at(self, global_positions: np.ndarray) -> np.ndarray:
        return global_positions

    def with_shard_options(self, shard_options: ShardOptions) -> ElementOrder:
        return self
