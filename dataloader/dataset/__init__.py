"""The chained dataset API (``MapDataset``, ``IterDataset``), on the loader's engine.

Users coming from Grain write ``MapDataset.source(src).seed(42).shuffle().map(f)
.batch(128).to_iter_dataset().mp_prefetch(...)``; the chain compiles to the source,
sampler and operations of a ``DataLoader``, so both styles share one permutation, one
work-unit plan, one worker pool, one state format and one device feed. Iterator-level
stages (packing, thread prefetch, a user's own ``IterDataset``) compose with it; see
:mod:`dataloader.dataset.base`.
"""

from dataloader.dataset.base import DatasetIterator, IterDataset
from dataloader.dataset.compile.mixing import MixSchedule, parse_mixture_spec
from dataloader.dataset.compile.schedule import WeightSchedule
from dataloader.dataset.device_put import device_put
from dataloader.dataset.experimental.select import DatasetSelectionMap
from dataloader.dataset.map_dataset import MapDataset

__all__ = [
    "DatasetIterator",
    "DatasetSelectionMap",
    "IterDataset",
    "MapDataset",
    "MixSchedule",
    "WeightSchedule",
    "device_put",
    "parse_mixture_spec",
]
