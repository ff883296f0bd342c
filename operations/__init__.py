"""Operations a pipeline applies to elements: map, random map, flat map, filter, batch.

Depends on numpy only; knows nothing of samplers, sources or the loader.
"""

from operations.batch import Batch, stack_elements
from operations.padding import BatchAndPad, batch_and_pad
from operations.transforms import (
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
