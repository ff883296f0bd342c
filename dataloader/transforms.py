"""``grain.transforms``' names for the operations, so Grain code runs with
``import dataloader as grain``: ``grain.transforms.Map`` is ``dl.MapTransform``, etc."""

from __future__ import annotations

from dataloader.operations import (
    Batch,
    FilterTransform,
    FlatMapTransform,
    MapTransform,
    MapWithIndexTransform,
    Operation,
    RandomMapTransform,
)

Map = MapTransform
RandomMap = RandomMapTransform
Filter = FilterTransform
FlatMap = FlatMapTransform
MapWithIndex = MapWithIndexTransform
Transformation = Operation
Transformations = list

__all__ = [
    "Batch",
    "Filter",
    "FlatMap",
    "Map",
    "MapWithIndex",
    "RandomMap",
    "Transformation",
    "Transformations",
]
