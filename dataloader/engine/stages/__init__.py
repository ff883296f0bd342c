"""Iterator-level stages: sequential steps over an ordered stream, in the consumer's process.

The engine computes positions in any process; what depends on the elements before
(packing, a batch of a filtered stream after a packer, bucketing) runs here, on
the ordered stream the engine hands out, so it never depends on the number of workers.
Each stage is a :class:`~dataloader.engine.stages.base.DatasetIterator` whose state
nests its parent's. ``DataLoader`` uses them for the operations after a packer, and the
dataset API for the iterator-level datasets.

Where a stage lives (one rule): a stage that ``DataLoader`` runs (an operation of its
list: element operations, batches, packers, the bucket batcher, the tail after a
packer, and the base class) lives here. A stage only the dataset API builds (interleave,
window shuffle, thread prefetch) lives beside its dataset in
``dataloader/dataset/transformations/``, the dataset and its iterator in one file.
"""
