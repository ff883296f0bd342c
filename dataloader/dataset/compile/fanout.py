"""Sub-chains read by index as random-access sources: ``flat_map`` and ``map_with_index``.

Both need the index an element has *at their place in the chain*, which the engine's
position (in the final stream, after shuffles and slices above them) is not; so the
sub-chain below them becomes a source the engine reads by key.

**flat_map**, with Grain's index layout.

``ds.flat_map(f)`` (``f`` with ``max_fan_out = F``) has ``F`` slots per element of
``ds``: index ``k`` is output ``k % F`` of ``f(ds[k // F])``, or ``None`` where that
element has fewer outputs (so random access needs no scan, and iteration skips the
holes). Reading the ``F`` slots of one element computes it once: batched reads group
keys by parent element.

Example:
    >>> from dataloader.dataset.compile import nodes as nd
    >>> from dataloader.operations import FlatMapTransform, MapWithIndexTransform
    >>> src = FanOutSource(nd.SourceNode([1, 2], 2), FlatMapTransform(lambda x: [x] * x, max_fan_out=2))
    >>> [src[k] for k in range(4)]
    [1, None, 2, 2]
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any, SupportsIndex

import numpy as np

from dataloader.operations import FlatMapTransform, MapWithIndexTransform


class _SubChainSource:
    """A sub-chain read by key, its parent's items read by index as Grain reads them:
    past the parent's length in its later epochs (a shuffle's next permutation), and
    for ever when the parent is endless. The compiled parent is per process."""

    def __init__(self, parent: Any) -> None:
        self.parent = parent

    def _parent_items(self, indices: Sequence[int] | np.ndarray) -> list[Any]:
        from dataloader.dataset.compile.lower import compile_node

        compiled = self.__dict__.get("_source")
        if compiled is None:
            compiled = self.__dict__["_source"] = compile_node(self.parent, None)
        return compiled.items(indices)  # runs of consecutive indices computed together

    @staticmethod
    def _keys(keys: Sequence[int] | np.ndarray) -> np.ndarray:
        keys = np.asarray(keys, dtype=np.int64).reshape(-1)
        if keys.size and keys.min() < 0:
            raise IndexError(f"index {int(keys.min())} is negative")
        return keys

    def __getitem__(self, key: SupportsIndex) -> Any:
        return self.__getitems__([operator.index(key)])[0]

    def __getitems__(self, keys: Sequence[int] | np.ndarray) -> list[Any]:
        raise NotImplementedError

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_source"}


class FanOutSource(_SubChainSource):
    """Key ``k`` -> output ``k % F`` of the flat map of the parent chain's item ``k // F``.

    ``len()`` is one pass (``F`` per parent element; ``F`` for an endless parent): the
    keys of one pass, as :class:`~dataloader.dataset.compile.index_map.IndexedLeaf` lays
    them out; keys past it read the parent's later epochs, as in Grain.
    """

    def __init__(self, parent: Any, op: FlatMapTransform) -> None:
        assert op.max_fan_out is not None
        super().__init__(parent)
        self.op = op
        self.fan_out = int(op.max_fan_out)

    def __len__(self) -> int:
        return self.fan_out * (1 if self.parent.length is None else self.parent.length)

    def __getitems__(self, keys: Sequence[int] | np.ndarray) -> list[Any]:
        indices, slots = np.divmod(self._keys(keys), self.fan_out)
        # Each parent item read once (all in one call) and flat-mapped once.
        wanted = list(dict.fromkeys(indices.tolist()))
        outputs = {
            index: [] if element is None else self.op.checked_flat_map(element)
            for index, element in zip(wanted, self._parent_items(wanted))
        }
        out: list[Any] = []
        for index, slot in zip(indices.tolist(), slots.tolist()):
            items = outputs[index]
            out.append(items[slot] if slot < len(items) else None)
        return out

    def __repr__(self) -> str:
        return f"{self.parent!r}.flat_map({self.op.name})"


class WithIndexSource(_SubChainSource):
    """Key ``k`` -> ``op(k, item k of the parent chain)`` (``None`` stays ``None``).

    ``k`` is the index as Grain gives it: past the parent's length it reads the parent's
    later epochs and is passed unreduced, so over an endless parent (``repeat()``) it
    counts on for ever. ``len()`` is one pass (1 for an endless parent).
    """

    def __init__(self, parent: Any, op: MapWithIndexTransform) -> None:
        super().__init__(parent)
        self.op = op

    def __len__(self) -> int:
        return 1 if self.parent.length is None else self.parent.length

    def __getitems__(self, keys: Sequence[int] | np.ndarray) -> list[Any]:
        fn = self.op.element_fn()
        keys = self._keys(keys)
        elements = self._parent_items(keys)
        return [None if e is None else fn(key, e) for key, e in zip(keys.tolist(), elements)]

    def __repr__(self) -> str:
        return f"{self.parent!r}.map_with_index({self.op.name})"
