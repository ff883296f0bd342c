"""Grain's window shuffles: ``WindowShuffleMapDataset`` and ``WindowShuffleIterDataset``.

Both cut the stream into windows of ``window_size`` consecutive elements and hand each
window out in the order of the keyed permutation :func:`~dataloader.samplers.permute`
of ``(seed, window number)``: a local shuffle, for data read in order (files shuffled
and interleaved, rows window-shuffled), that costs one window of memory at most.

* ``WindowShuffleMapDataset`` is an index map (:class:`~dataloader.dataset.compile.
  index_map.WindowShuffle`): ``ds[i]`` costs O(1), nothing is held in memory, it
  compiles onto the engine like ``shuffle()`` (worker processes, O(1) states) and every
  epoch draws new permutations. Each epoch ends with a shorter window, the remainder,
  so an epoch is a permutation of the parent's epoch (Grain's last window can reach
  past the end).
* ``WindowShuffleIterDataset`` reads its parent's stream, one window in memory
  (:mod:`dataloader.engine.stages.window_shuffle` says how its state and restore work).

On one pass the two give the same order: window ``w`` is permuted by ``(seed, w)`` in
both. Grain keys window ``w`` with ``seed + w``, so its windows of seed ``s`` repeat
those of seed ``s + 1`` shifted by one; ours are unrelated, and the orders differ from
Grain's.

Example:
    >>> import dataloader as dl
    >>> ds = dl.experimental.WindowShuffleMapDataset(dl.MapDataset.range(8), window_size=4, seed=0)
    >>> [sorted(ds[w * 4:(w + 1) * 4]) for w in range(2)]
    [[0, 1, 2, 3], [4, 5, 6, 7]]
"""

from __future__ import annotations

from dataloader.dataset.arguments import SHUFFLE_BITS, check_seed, check_size
from dataloader.dataset.base import DatasetIterator, IterDataset
from dataloader.dataset.compile import nodes as nd
from dataloader.dataset.map_dataset import MapDataset
from dataloader.engine.stages.window_shuffle import WindowShuffleDatasetIterator


class WindowShuffleMapDataset(MapDataset):
    """``parent`` shuffled within windows of ``window_size`` elements (random access).

    Args:
        parent: the ``MapDataset`` to shuffle.
        window_size: elements per window (a window longer than the dataset shuffles
            the whole epoch).
        seed: the permutations' key.

    Raises:
        ValueError: ``window_size`` is not a positive integer, or ``seed`` is not a
            non-negative integer.
        TypeError: ``parent`` is not a ``MapDataset``.
    """

    def __init__(self, parent: MapDataset, *, window_size: int, seed: int) -> None:
        if not isinstance(parent, MapDataset):
            raise TypeError(
                f"WindowShuffleMapDataset shuffles a MapDataset, got {parent!r}; for a stream "
                f"use WindowShuffleIterDataset"
            )
        size = check_size(window_size, "window_size")
        node = nd.WindowShuffleNode(parent._node, check_seed(seed, "seed", bits=SHUFFLE_BITS), size, parent._node.length)
        super().__init__(parent)
        # A node of the chain (not a dataset read through __getitem__): it compiles.
        self._chain_node = node
        self._seed, self._seed_uses, self._filtered = parent._seed, parent._seed_uses, parent._filtered


class WindowShuffleIterDataset(IterDataset):
    """``parent``'s stream shuffled within windows of ``window_size`` elements.

    Args:
        parent: the ``IterDataset`` to shuffle.
        window_size: elements per window, all held in memory at once.
        seed: the permutations' key.

    Raises:
        ValueError: ``window_size`` is not a positive integer, or ``seed`` is not a
            non-negative integer.
        TypeError: ``parent`` is not an ``IterDataset``.

    Example:
        >>> import dataloader as dl
        >>> ds = dl.MapDataset.range(6).to_iter_dataset()
        >>> out = list(dl.experimental.WindowShuffleIterDataset(ds, window_size=3, seed=1))
        >>> sorted(out[:3]), sorted(out[3:])
        ([0, 1, 2], [3, 4, 5])
    """

    def __init__(self, parent: IterDataset, *, window_size: int, seed: int) -> None:
        if not isinstance(parent, IterDataset):
            hint = (" (WindowShuffleMapDataset shuffles a MapDataset; or call to_iter_dataset() "
                    "first)") if isinstance(parent, MapDataset) else ""
            raise TypeError(f"WindowShuffleIterDataset reads an IterDataset, got {parent!r}{hint}")
        super().__init__(parent)
        self.window_size = check_size(window_size, "window_size")
        self.window_seed = check_seed(seed, "seed", bits=SHUFFLE_BITS)

    def __iter__(self) -> DatasetIterator:
        return WindowShuffleDatasetIterator(iter(self._parent), self.window_size, self.window_seed)

    def __repr__(self) -> str:
        return (f"WindowShuffleIterDataset({self._parent!r}, window_size={self.window_size}, "
                f"seed={self.window_seed})")
