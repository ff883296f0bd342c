"""Iterator-level stages: sequential steps over an ordered stream, in the consumer's process.

The engine computes positions in any process; what depends on the elements before
(packing, a batch of a filtered stream after a packer, bucketing) runs here, on
the ordered stream the engine hands out, so it never depends on the number of workers.
Each stage is a :class:`~dataloader.engine.stages.base.DatasetIterator` whose state
nests its parent's. ``DataLoader`` uses them for the operations after a packer, and the
dataset API for the iterator-level datasets.

Where a stage lives (one rule, checked by ``tests/test_layout.py``: the engine never
imports ``dataloader.dataset``):

- A stage that ``DataLoader`` runs lives here, whoever else runs it: the base class
  (``base``), element operations (``elementwise``), packers (``packing``), the bucket
  batcher (``bucket``), the tail after a packer (``tail``), the padded end of finite
  data (``finite``), and the element-wise operations after an iterated stage computed
  on a pool (``shipped``, with ``feeder``, which cuts the iterated stage into units).
- A stage only the dataset API builds (interleave, window shuffle, thread prefetch,
  Grain's experimental datasets) lives beside its dataset in
  ``dataloader/dataset/transformations/`` or ``dataloader/dataset/experimental/``, the
  dataset and its iterator in one file; the dataset API reaches a stage of here by
  importing it (``transformations/pooled.py`` names ``shipped``'s iterator), never by
  copying it.
- What is not a stage stays in its own room even when a stage uses it: how shipped
  elements travel (``engine/shipped_inputs.py``), an order of positions (the samplers,
  ``samplers/view.py``), the pool (``engine/pool/``).
"""
