"""Iterator-level stages: sequential steps over an ordered stream, in the consumer's process.

The engine computes positions in any process; what depends on the elements before
(packing, a batch of a filtered stream after a packer, thread prefetch) runs here, on
the ordered stream the engine hands out, so it never depends on the number of workers.
Each stage is a :class:`~dataloader.engine.stages.base.DatasetIterator` whose state
nests its parent's. ``DataLoader`` uses them for the operations after a packer, and the
dataset API for the iterator-level datasets.

Where a stage lives (one rule): a stage that ``DataLoader`` runs (an operation of its
list: element operations, packers, the tail after a packer, and the base class) lives
here. A stage only the dataset API builds lives beside its dataset in
``dataloader/dataset/transformations/``, the dataset and its iterator in one file (as
``window_shuffle`` is). Two older dataset-only iterators still live here and move when
next touched: ``interleave`` (beside its dataset it makes a module of 420 lines, so it
wants a split of its own first) and ``prefetch`` (its thread-owning base class is
subclassed by Grain's ``ThreadPrefetchDatasetIterator`` under the same name).
"""
