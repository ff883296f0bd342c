"""Operations a pipeline applies to elements: map, random map, flat map, filter, batch.

Depends on numpy only; knows nothing of samplers, sources or the loader.
"""

from operations.batch import Batch, stack_elements
from operations.transforms import (
    FilterTransform,
    FlatMapTransform,
    MapTransform,
    Operation,
    RandomMapTransform,
)

__all__ = [
    "Batch",
    "FilterTransform",
    "FlatMapTransform",
    "MapTransform",
    "Operation",
    "RandomMapTransform",
    "stack_elements",
]
