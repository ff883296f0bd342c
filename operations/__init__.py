"""Operations a pipeline applies to elements: map, random map, flat map, filter, batch.

Depends on numpy only; knows nothing of samplers, sources or the loader.
"""

from .batch import Batch, stack_elements
from .padding import BatchAndPad, batch_and_pad
from .transforms import (
    FilterTransform,
    FlatMapTransform,
    MapTransform,
    Operation,
    RandomMapTransform,
)

__all__ = [
    "Batch",
    "BatchAndPad",
    "FilterTransform",
    "FlatMapTransform",
    "MapTransform",
    "Operation",
    "RandomMapTransform",
    "batch_and_pad",
    "stack_elements",
]
