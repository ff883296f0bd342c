"""``dl.experimental``: the names of ``grain.experimental``, on granary's engine.

Code written against ``grain.experimental`` runs with ``import dataloader as grain``.
Where granary's version differs on purpose, the README's Grain table says how.
"""

from __future__ import annotations

from dataloader.dataset.transformations.prefetch import (
    ThreadPrefetchDatasetIterator,
    ThreadPrefetchIterDataset,
    multithread_prefetch,
)
from dataloader.operations import FlatMapTransform, MapWithIndexTransform

__all__ = [
    "FlatMapTransform",
    "MapWithIndexTransform",
    "ThreadPrefetchDatasetIterator",
    "ThreadPrefetchIterDataset",
    "multithread_prefetch",
]
