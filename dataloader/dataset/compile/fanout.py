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


class FanOutSource:
    """Key ``k`` -> output ``k % F`` of the flat map of the parent chain's item ``k // F``."""

    def __init__(self, parent: Any, op: FlatMapTransform) -> None:
        assert op.max_fan_out is not None
        self.parent = parent
        self.op = op
        self.fan_out = int(op.max_fan_out)

    def _parent_items(self, indices: list[int]) -> list[Any]:
        from dataloader.dataset.compile.lower import NodeSource

        source = self.__dict__.get("_source")
        if source is None:
            source = self.__dict__["_source"] = NodeSource(self.parent)
        return source.__getitems__(indices)

    def __len__(self) -> int:
        return self.parent.length * self.fan_out

    def __getitem__(self, key: SupportsIndex) -> Any:
        return self.__getitems__([operator.index(key)])[0]

    def __getitems__(self, keys: Sequence[int] | np.ndarray) -> list[Any]:
        keys = np.asarray(keys, dtype=np.int64).reshape(-1)
        bad = keys[(keys < 0) | (keys >= len(self))]
        if len(bad):
            raise IndexError(f"index {int(bad[0])} is out of range for {len(self)} slots")
        indices, slots = np.divmod(keys, self.fan_out)
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

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_source"}

    def __repr__(self) -> str:
        return f"{self.parent!r}.flat_map({self.op.name})"


class WithIndexSource:
    """Key ``k`` -> ``op(k, item k of the parent chain)`` (``None`` stays ``None``)."""

    def __init__(self, parent: Any, op: MapWithIndexTransform) -> None:
        self.parent = parent
        self.op = op

    def __len__(self) -> int:
        return self.parent.length

    def __getitem__(self, key: SupportsIndex) -> Any:
        return self.__getitems__([operator.index(key)])[0]

    def __getitems__(self, keys: Sequence[int] | np.ndarray) -> list[Any]:
        from dataloader.dataset.compile.lower import NodeSource

        source = self.__dict__.get("_source")
        if source is None:
            source = self.__dict__["_source"] = NodeSource(self.parent)
        fn = self.op.element_fn()
        keys = np.asarray(keys, dtype=np.int64).reshape(-1)
        elements = source.__getitems__(keys)  # one call: consecutive keys share a unit
        return [None if e is None else fn(key, e) for key, e in zip(keys.tolist(), elements)]

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_source"}

    def __repr__(self) -> str:
        return f"{self.parent!r}.map_with_index({self.op.name})"
