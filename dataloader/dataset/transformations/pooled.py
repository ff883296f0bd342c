"""Element-wise calls after an iterator-level stage, computed on the worker pool.

Under ``mp_prefetch`` (or ``GRANARY_WORKER_COUNT``), the ``map``/``random_map``/
``filter``/``flat_map`` calls chained after a stage that can only be iterated (a packer,
a window shuffle or interleave over such parents, a mix, a user's ``IterDataset``, a
gzip TFRecord stream) run in worker processes: this process iterates the stage, cuts
its elements into units of :data:`UNIT_SIZE` consecutive elements and ships each unit
to a worker (:mod:`dataloader.engine.shipped`); results come back in unit order.

The unit size does not depend on the worker count, and element ``i`` of the stage
keys the random generators as it does element by element
(:mod:`dataloader.engine.stages.elementwise`), so the output is the same for 0, 1, 2 or
``"auto"`` workers, and so is every state: ``{"parent": the stage's state at the start
of the current unit, "index": that unit's first element, "skip": how many of the
unit's outputs were handed out}``. A restore replays at most one unit of the stage.
A state of the element-by-element stage (same keys: ``skip`` counts outputs of element
``index``, the first of the unit) restores here too, and the element-by-element stage
reads these (:mod:`dataloader.dataset.transformations.elementwise`): a checkpoint moves
between runs with and without worker processes.

An error in user code arrives at its element's place, naming the operation; the
iterator then raises it again on every ``next()`` (restore a state to go on). A unit
lost with a killed worker is computed again from the elements kept for it.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from dataloader.engine.executor import InProcessExecutor
from dataloader.engine.shipped import Feeder, ShippedInputs, shipped_plans
from dataloader.engine.stages.base import DatasetIterator, expect_state
from dataloader.errors import PipelineError
from dataloader.operations import Operation
from dataloader.options import (
    DEFAULT_STALL_WARNING_S,
    MultiprocessingOptions,
    ReadOptions,
    check_worker_count,
)

# Elements of the iterated stage per unit: a fixed grid, whatever the worker count.
UNIT_SIZE = 64


def can_ship(ops: tuple[Operation, ...]) -> bool:
    """Whether the pool can compute ``ops`` (an index counted in order cannot)."""
    return not any(getattr(op, "needs_index", False) for op in ops)


class PooledElementwiseIterator(DatasetIterator):
    """``ops`` over ``parent``'s elements, unit by unit, on ``options.num_workers``
    worker processes (0: in this process, unit by unit all the same).

    Args:
        parent: the iterated stage.
        ops: the element-wise operations (no ``map_with_index``).
        options: how many workers, and units in flight per worker.
        init_fn: ``worker_init_fn(worker_index, worker_count)``.
        watch: Grain's filter thresholds over this stage (a ``FilterWatch``) or None.
        unit_size: elements of ``parent`` per unit.
    """

    def __init__(
        self,
        parent: DatasetIterator,
        ops: tuple[Operation, ...],
        options: MultiprocessingOptions,
        init_fn: Any = None,
        watch: Any = None,
        unit_size: int = UNIT_SIZE,
    ) -> None:
        super().__init__(parent)
        self._stats_name = " + ".join(op.name for op in ops)
        self._ops = ops
        self._watch = watch
        count = check_worker_count("num_workers", options.num_workers)
        self._inputs = ShippedInputs(unit_size, shared=count != 0)
        self._release = weakref.finalize(self, self._inputs.close)
        self._feeder = Feeder(parent, self._inputs)
        # Where the consumer stands: (stage state at the unit's start, its first element,
        # outputs of that unit handed out). Taken before any unit is read.
        self._at: tuple[Any, int, int] = (parent.get_state(), 0, 0)
        self._outputs: list[Any] = []
        self._given = 0
        self._error: BaseException | None = None  # raised once the outputs before it are out
        self._failed: BaseException | None = None  # raised again on every next()
        self._ended = False
        plan, worker_plan = shipped_plans(ops, self._inputs, self._feeder)
        self._executor: Any
        if count == 0:
            self._executor = InProcessExecutor(plan, 0, ReadOptions())
        else:
            from dataloader.engine.pool import zygote
            from dataloader.engine.pool.executor import PoolExecutor
            from dataloader.engine.pool.messages import pickle_plan

            plan_bytes = pickle_plan(worker_plan)
            zygote.prestart(plan_bytes)
            self._executor = PoolExecutor(
                plan, plan_bytes, 0, worker_count=count,
                buffer_size=options.per_worker_buffer_size, init_fn=init_fn,
                stall_warning_s=DEFAULT_STALL_WARNING_S,  # as a DataLoader's pool
            )

    def __next__(self) -> Any:
        if self._closed:
            raise ValueError(f"next() on a closed iterator ({self!r}); make a new one")
        while self._given == len(self._outputs):
            if self._error is not None:
                self._failed, self._error = self._error, None
            if self._failed is not None:
                raise self._failed
            if self._ended:
                raise StopIteration
            self._take_unit()
        item = self._outputs[self._given]
        self._outputs[self._given] = None  # handed out: not kept alive here
        self._given += 1
        parent_state, start, _ = self._at
        self._at = (parent_state, start, self._at[2] + 1)
        return item

    def _take_unit(self) -> None:
        try:
            result = next(self._executor)
        except StopIteration:
            if self._feeder.error is not None:  # the stage failed after the last unit
                self._failed = self._feeder.error
                raise self._failed from None
            self._ended = True
            raise
        except PipelineError as exc:  # a unit that failed whole (its worker kept dying)
            self._failed = exc
            raise
        self._inputs.drop(result.start)
        state = self._feeder.states.pop(result.start)
        skip = self._at[2] if self._at[1] == result.start and not self._outputs else 0
        self._at = (state, result.start, skip)
        self._outputs, self._given = result.outputs, min(skip, len(result.outputs))
        if result.error is not None:
            self._error = result.error
        if self._watch is not None:
            n = result.stop - result.start
            kept = len(np.unique(result.positions)) if result.positions is not None else len(result.outputs)
            self._watch.add(n, n - kept)

    def get_state(self) -> dict[str, Any]:
        parent_state, start, skip = self._at
        return {"parent": parent_state, "index": start, "skip": skip}

    def set_state(self, state: dict[str, Any]) -> None:
        state = expect_state(state, ("parent", "index", "skip"), f"{self!r}")
        index, skip = int(state["index"]), int(state["skip"])
        # The upstream is restored where it is read: a pool reads it in a thread of its
        # own before the first next(), under its lock, which reset() waits for.
        self._feeder.restore(state["parent"])
        self._at = (state["parent"], index, skip)
        self._outputs, self._given = [], 0
        self._error = self._failed = None
        self._ended = False
        self._executor.reset(index)

    def close(self) -> None:
        if self._closed:
            return
        self._executor.close()
        self._release()
        super().close()

    def __repr__(self) -> str:
        return f"PooledElementwiseIterator({' + '.join(op.name for op in self._ops)})"
