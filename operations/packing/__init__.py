"""Packing variable-length sequences into fixed-length rows (first-fit, best-fit,
concat-then-split), with ``<f>_segment_ids`` and ``<f>_positions`` as Grain writes them.

These are the packing stages of a pipeline: give one to a ``DataLoader`` among its
operations (it runs on the ordered stream, after the operations before it), or use the
dataset classes ``FirstFitPackIterDataset``, ``BestFitPackIterDataset`` and
``ConcatThenSplitIterDataset``. numpy only.
"""

from .concat import BOSHandling, ConcatRow, ConcatThenSplit
from .fit import BestFitPack, FirstFitPack, FitPack, FitRound
from .pack_and_batch import PackAndBatchOperation
from .spec import PackSpec

__all__ = [
    "BOSHandling",
    "BestFitPack",
    "ConcatRow",
    "ConcatThenSplit",
    "FirstFitPack",
    "FitPack",
    "FitRound",
    "PackAndBatchOperation",
    "PackSpec",
]
