"""Element-wise calls after an iterator-level stage, computed on the worker pool.

Under ``mp_prefetch`` (or ``GRANARY_WORKER_COUNT``), the ``map``/``random_map``/
``filter``/``flat_map`` calls chained after a stage that can only be iterated (a packer,
a window shuffle or interleave over such parents, a mix, a user's ``IterDataset``, a
gzip TFRecord stream) run in worker processes: this process iterates the stage, cuts
its elements into units of :data:`UNIT_SIZE` consecutive elements and ships each unit
to a worker (:mod:`dataloader.engine.stages.shipped`); results come back in unit order.

The unit size does not depend on the worker count, and element ``i`` of the stage
keys the random generators as it does element by element
(:mod:`dataloader.engine.stages.elementwise`), so the output is the same for 0, 1, 2 or
``"auto"`` workers, and so is every state: ``{"parent": the stage's state before the
element the next output comes from, "index": that element, "skip": how many of its
outputs were handed out}``, the keys and meaning of the element-by-element stage's
states (this process takes the stage's state before every element it ships). So a
state still names the same element when the stage is rebuilt otherwise (a mixture
restored with other weights), and a checkpoint moves between runs with and without
worker processes (:mod:`dataloader.dataset.transformations.elementwise` reads these).
A restore recomputes from that element, never the stream.

An error in user code arrives at its element's place, naming the operation; the
next ``next()`` goes on with the element after it, and an error of the iterated stage
itself is followed by what that stage gives next, as element by element (the state
after an error is the element-by-element stage's there too). A unit lost with a killed
worker is computed again from the elements kept for it.
"""

from __future__ import annotations

from dataloader.engine.stages.feeder import UNIT_SIZE
from dataloader.engine.stages.shipped import ShippedElementwiseIterator
from dataloader.operations import Operation

# The iterator lives in the engine, where a DataLoader's stages can use it too.
PooledElementwiseIterator = ShippedElementwiseIterator
__all__ = ["UNIT_SIZE", "PooledElementwiseIterator", "can_ship"]


def can_ship(ops: tuple[Operation, ...]) -> bool:
    """Whether the pool can compute ``ops`` (an index counted in order cannot)."""
    return not any(op.needs_index for op in ops)
