"""``MapDataset.select_from_datasets``: a dataset routed from others by an explicit map.

Grain's most general mixture: a selection map (``DatasetSelectionMap``: ``__len__`` and
``__getitem__``) says, for each index ``i`` of the result, which dataset ``c`` and which
index ``k`` in it to read: ``result[i] = datasets[c][k]``. The map must be deterministic
and picklable (workers ask it too); its length is the result's length.

The selection compiles into the index map of the engine (:class:`~dataloader.dataset.
compile.index_map.Select`), so the result is a ``MapDataset`` like any other: shuffle,
batch or ``to_iter_dataset()`` it, and its state stays one position.

Example:
    >>> import dataloader as dl
    >>> class Alternate(dl.DatasetSelectionMap):
    ...     def __len__(self):
    ...         return 6
    ...     def __getitem__(self, index):
    ...         return index % 2, index // 2
    >>> evens, odds = dl.MapDataset.range(0, 6, 2), dl.MapDataset.range(1, 6, 2)
    >>> list(dl.MapDataset.select_from_datasets([evens, odds], Alternate()))
    [0, 1, 2, 3, 4, 5]
"""

from __future__ import annotations

import abc
import numbers
from collections.abc import Sequence
from typing import Any

from dataloader.dataset.compile import nodes as nd
from dataloader.dataset.compile.index_map import check_selection


class DatasetSelectionMap(abc.ABC):
    """Maps an index of the result to ``(dataset index, index within that dataset)``.

    Subclass it (Grain's ``grain.transforms.DatasetSelectionMap``), or pass any object
    with these two methods. It must be stateless, deterministic and picklable.
    """

    @abc.abstractmethod
    def __len__(self) -> int:
        """The number of indices of the result (one pass)."""

    @abc.abstractmethod
    def __getitem__(self, index: int) -> tuple[int, int]:
        """``(dataset index, index within that dataset)`` for ``index`` in ``[0, len)``."""


def select_from_datasets(datasets: Sequence[Any], selection_map: Any) -> Any:
    """The dataset whose index ``i`` is ``datasets[c][k]`` for ``(c, k) = selection_map[i]``.

    Raises:
        TypeError: a dataset that is not a ``MapDataset``, or a map without ``__len__``
            and ``__getitem__``.
        ValueError: no datasets, an empty map, or an entry that is not a pair
            ``(dataset index, index)`` in range (the first entries are checked here,
            the others when they are read).
    """
    from dataloader.dataset.map_dataset import _check_datasets, _combine

    datasets = _check_datasets(datasets, "select_from_datasets")
    if not (hasattr(selection_map, "__len__") and hasattr(selection_map, "__getitem__")):
        raise TypeError(
            f"select_from_datasets needs a selection map with __len__ and __getitem__ (a "
            f"DatasetSelectionMap), got {selection_map!r}"
        )
    length = len(selection_map)
    if not isinstance(length, numbers.Integral) or length < 1:
        raise ValueError(
            f"select_from_datasets got a selection map of length {length!r}; it must select "
            f"at least one element"
        )
    for i in range(min(int(length), 16)):  # early, with the index in the message
        check_selection(selection_map, i, len(datasets))
    node = nd.SelectNode(tuple(d._node for d in datasets), selection_map, int(length))
    return _combine(node, datasets)
