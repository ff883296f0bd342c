"""Operations a pipeline applies to elements: map, random map, flat map, filter, batch,
padding, packing, bucketing by length and tokenization.

Depends on numpy only (a tokenizer library is imported when a ``Tokenize`` is used);
knows nothing of samplers, sources or the loader.
"""


from .batch import Batch, stack_elements
from .bucket import BucketByLength
from .packing import BestFitPack, BOSHandling, ConcatThenSplit, FirstFitPack
from .padding import BatchAndPad, batch_and_pad, batch_and_pad_with_mask
from .tokenize import Tokenize
from .transforms import (
    FilterTransform,
    FlatMapTransform,
    MapTransform,
    MapWithIndexTransform,
    Operation,
    RandomMapTransform,
)

__all__ = [
    "BOSHandling",
    "Batch",
    "BatchAndPad",
    "BestFitPack",
    "BucketByLength",
    "ConcatThenSplit",
    "FilterTransform",
    "FirstFitPack",
    "FlatMapTransform",
    "MapTransform",
    "MapWithIndexTransform",
    "Operation",
    "RandomMapTransform",
    "Tokenize",
    "batch_and_pad",
    "batch_and_pad_with_mask",
    "stack_elements",
]

if __name__ != "dataloader.operations":  # pragma: no cover - a wrong sys.path, not a user error
    raise ImportError(
        f"this folder is installed as dataloader.operations, but it was imported as {__name__!r}; "
        f"import dataloader.operations (install the project with pip install -e . to develop it)"
    )
