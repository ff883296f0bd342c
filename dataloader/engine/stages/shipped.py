"""Element-wise work after a stage that only iterates, computed unit by unit on a pool.

A stage with no random-access form (a packer, a window shuffle, a mix at the iterator
level, a user's ``IterDataset``, a gzip TFRecord stream) is iterated in order in the
training process (:class:`~dataloader.engine.stages.feeder.Feeder`); the element-wise
operations after it run on a pool, each unit's elements shipped to its worker
(:mod:`dataloader.engine.shipped_inputs`), with the output and state keys of the
element-by-element stage (:mod:`dataloader.dataset.transformations.pooled`). A
``DataLoader`` runs it after its packer, the dataset API after an iterator-level stage
under ``mp_prefetch``: it lives with the stages (the rule in :mod:`dataloader.engine.stages`).
Its pool is its own, of the loader's ``worker_kind``, so a pipeline with an engine-backed
part before it runs two pools of ``num_workers`` workers (the measured cost of two
process pools: ``docs/streaming.md``, "Where each stage runs"): records read by index
and elements shipped from here are two streams.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import numpy as np

from dataloader.engine.in_process import InProcessExecutor
from dataloader.engine.restore.protocol import ElasticDefaults, StatePart
from dataloader.engine.shipped_inputs import ShippedInputs
from dataloader.engine.stages.base import DatasetIterator, expect_state
from dataloader.engine.stages.elementwise import element_part
from dataloader.engine.stages.feeder import UNIT_SIZE, Feeder, go_on_after, shipped_plans
from dataloader.errors import PipelineError
from dataloader.operations import Operation
from dataloader.operations.transforms import MANY
from dataloader.options import (
    DEFAULT_STALL_WARNING_S,
    MultiprocessingOptions,
    ReadOptions,
    check_worker_count,
    check_worker_kind,
)


class ShippedElementwiseIterator(DatasetIterator, ElasticDefaults):
    """``ops`` over ``parent``'s elements, unit by unit, on ``options.num_workers``
    workers of ``options.worker_kind`` (0: in this process, unit by unit all the same).

    Its output is that of :class:`~dataloader.engine.stages.elementwise.ElementwiseIterator`
    with the same ``default_seed``, and its states use the same keys (see
    :mod:`dataloader.dataset.transformations.pooled`), so it can stand in for it wherever
    workers are wanted (a ``DataLoader``'s operations after a packer, for instance).

    Args:
        parent: the iterated stage.
        ops: the element-wise operations (no ``map_with_index``).
        options: how many workers, and units in flight per worker.
        init_fn: ``worker_init_fn(worker_index, worker_count)``.
        watch: Grain's filter thresholds over this stage (a ``FilterWatch``) or None.
        unit_size: elements of ``parent`` per unit.
        default_seed: the seed of random maps that have none of their own (a loader's
            sampler seed), as for ``ElementwiseIterator``.
    """

    def __init__(
        self,
        parent: DatasetIterator,
        ops: tuple[Operation, ...],
        options: MultiprocessingOptions,
        init_fn: Any = None,
        watch: Any = None,
        unit_size: int = UNIT_SIZE,
        default_seed: int | None = None,
    ) -> None:
        super().__init__(parent)
        self.stats_name = " + ".join(op.name for op in ops)
        self._ops = ops
        self._watch = watch
        count = check_worker_count("num_workers", options.num_workers)
        kind = check_worker_kind("worker_kind", options.worker_kind) if count != 0 else "processes"
        # Threads read the elements where the feeder put them; processes (and auto, which
        # may hand over to them) through shared memory.
        self._inputs = ShippedInputs(unit_size, shared=count != 0 and kind != "threads")
        self._release = weakref.finalize(self, self._inputs.close)
        self._feeder = Feeder(parent, self._inputs)
        # The state before the first output of the unit to come (taken before any unit
        # is read, then set by a restore, an error or the end), as the element-by-element
        # stage has it there.
        self._at: dict[str, Any] = {"parent": parent.get_state(), "index": 0, "skip": 0}
        self._outputs: list[Any] = []
        self._given = 0
        # The unit being handed out: (start, the upstream's states before each shipped
        # element and after the last, output positions and subs), or None.
        self._unit: tuple[int, list[Any], Any, Any, Any] | None = None
        self._error: BaseException | None = None  # raised once the outputs before it are out
        self._failed: BaseException | None = None  # raised again on every next()
        # Where to go on after an error was raised: (upstream state or None to read on
        # where the upstream is, element index), as the element-by-element stage goes on.
        self._go_on: tuple[list[Any], int] | None = None
        self._resume: tuple[list[Any], int] | None = None
        self._ended = False
        self._expands = any(op.returns == MANY for op in ops)
        # The unit being handed out: (start, output positions, its elements' engine tags,
        # the upstream's state before it); set by an elastic restore until it settles.
        self._tags: tuple[int, Any, list[Any], Any] = (0, None, [], None)
        self._restarted = False
        plan, worker_plan = shipped_plans(ops, self._inputs, self._feeder, default_seed)
        self._executor: Any
        if count == 0:
            self._executor = InProcessExecutor(plan, 0, ReadOptions())
        else:
            from dataloader.engine.pool import zygote
            from dataloader.engine.pool.executor import PoolExecutor
            from dataloader.engine.pool.messages import pickle_plan

            plan_bytes = b""  # threads share the parent's plan itself
            if kind != "threads":
                plan_bytes = pickle_plan(worker_plan)
                zygote.prestart(plan_bytes)
            self._executor = PoolExecutor(
                plan, plan_bytes, 0, worker_count=count,
                buffer_size=options.per_worker_buffer_size, init_fn=init_fn,
                stall_warning_s=DEFAULT_STALL_WARNING_S,  # as a DataLoader's pool
                worker_kind=kind,
            )

    def __next__(self) -> Any:
        if self._closed:
            raise ValueError(f"next() on a closed iterator ({self!r}); make a new one")
        resume, self._resume = self._resume, None
        if resume is not None:  # after an error: on with the element after it
            self._restart(*resume)
        while self._given == len(self._outputs):
            if self._error is not None:
                self._raise_error()
            if self._failed is not None:
                raise self._failed
            if self._ended:
                raise StopIteration
            self._take_unit()
        item = self._outputs[self._given]
        self._outputs[self._given] = None  # handed out: not kept alive here
        self._given += 1
        return item

    def ready(self) -> int:
        """The outputs of the unit being handed out that are still to come: a thread
        reading this stage ahead takes them together (see ``DatasetIterator.ready``)."""
        if self._closed or self._resume is not None:
            return 0
        return len(self._outputs) - self._given

    def _raise_error(self) -> NoReturn:
        """Raises the error after the outputs before it, and goes on after it next time
        (as a dataset iterated in order does): the state is then the one after it."""
        error, self._error = self._error, None
        assert error is not None and self._go_on is not None
        restore, index = self._go_on
        self._go_on = None
        if not restore:  # the upstream raised: it reads on from where it stands
            self._at = {"parent": self._feeder.error_state, "index": index, "skip": 0}
        else:
            self._at = {"parent": restore[0], "index": index, "skip": 0}
        self._unit, self._outputs, self._given = None, [], 0
        self._resume = (restore, index)
        raise error

    def _restart(self, restore: list[Any], index: int) -> None:
        """A new stream of units from element ``index``, the upstream first restored to
        ``restore[0]`` when given."""
        if restore:
            upstream, state = self._parent, restore[0]
            self._feeder.restore(lambda: upstream.set_state(state))
        self._executor.reset(index)

    def _take_unit(self) -> None:
        try:
            result = next(self._executor)
        except StopIteration:
            if self._feeder.error is not None:  # the stage failed after the last unit
                self._error = self._feeder.error
                self._go_on = ([], self._feeder.error_at)
                self._raise_error()
            self._ended = True
            self._at = {"parent": self._feeder.end_state, "index": self._feeder.end_at, "skip": 0}
            self._unit, self._outputs, self._given = None, [], 0
            raise
        except PipelineError as exc:
            if exc.position is None or exc.position not in self._feeder.states:
                self._failed = exc  # a unit that failed whole (its worker kept dying)
                raise
            # Its first element failed (compute_unit cuts a unit only after one): the
            # unit has no output, and the stream goes on after that element.
            self._error, self._go_on = exc, self._after_failed(exc.position, exc.position)
            self._raise_error()
        self._inputs.drop(result.start)
        befores, after = self._feeder.states.pop(result.start)
        self._tags = (result.start, result.positions, self._feeder.tags.pop(result.start, []), befores[0])
        start = result.start
        if self._restarted:  # the first unit after an elastic restore: the parent's state is known
            self._restarted = False
            self._at = {"parent": befores[0], "index": start, "skip": 0}
        skip = int(self._at["skip"]) if self._at["index"] == start and self._unit is None else 0
        self._unit = (start, befores, after, result.positions, result.subs)
        self._outputs, self._given = result.outputs, min(skip, len(result.outputs))
        if result.error is not None:
            # The unit was cut at the failing element: go on with the next one.
            self._error, self._go_on = result.error, go_on_after(befores, after, start, result.stop)
        if self._watch is not None:
            n = result.stop - result.start
            kept = len(np.unique(result.positions)) if result.positions is not None else len(result.outputs)
            self._watch.add(n, n - kept)

    def _after_failed(self, start: int, failed: int) -> tuple[list[Any], int]:
        """Where the stream goes on after element ``failed`` of the unit at ``start``
        failed; frees the unit."""
        befores, after = self._feeder.states.pop(start)
        self._feeder.tags.pop(start, None)
        self._inputs.drop(start)
        return go_on_after(befores, after, start, failed)

    # The elastic-restore protocol (dataloader.engine.restore.protocol.ElasticStage), with
    # the states of the element-by-element stage.

    def last_tag(self) -> Any:
        """The engine's (position, sub) of the element the last output came from, when
        each output is one element (no flat map) and the parent says it; else None. A
        packer over this stage names its rows' records by it (elastic restore)."""
        if self._given == 0 or self._expands:
            return None
        start, positions, tags, _ = self._tags
        e = (int(positions[self._given - 1]) if positions is not None else start + self._given - 1) - start
        return tags[e] if 0 <= e < len(tags) else None

    def split_state(self, state: Any) -> StatePart:
        return element_part(state, f"{self!r}")

    def restart_elastic(self, resume: Callable[[], None], kept: Sequence[Any]) -> None:
        """Starts empty; the feeder calls ``resume()`` (the parent's restart on this
        host's share) in the thread that reads the parent, before it reads on."""
        self._set_at({"parent": None, "index": 0, "skip": 0})
        self._restarted = True
        self._feeder.restore(resume)
        self._executor.reset(0)

    def get_state(self) -> dict[str, Any]:
        """The element-by-element stage's state at the same output: the element the
        last output came from and how many of its outputs were handed out, or, all of
        them out, the upstream's state after it."""
        if self._restarted:
            self._settle()
        unit = self._unit
        if unit is None or self._given == 0:
            return dict(self._at)
        start, befores, after, positions, subs = unit
        j = self._given
        last = int(positions[j - 1]) if positions is not None else start + j - 1
        if j < len(self._outputs):
            e = int(positions[j]) if positions is not None else start + j
            if e == last:  # more outputs of the same element to come
                s = int(subs[j]) if subs is not None else 0
                return {"parent": befores[e - start], "index": e, "skip": s}
        n = last + 1
        return {"parent": befores[n - start] if n - start < len(befores) else after, "index": n, "skip": 0}

    def _settle(self) -> None:
        """After an elastic restore, the parent's state is known once the feeder (in the
        pool's thread) has restored it: read the first unit, and restore that state."""
        self._restarted = False
        try:
            self._take_unit()
            first = self._tags[3]
        except StopIteration:
            first = self._parent.get_state()  # nothing left: the feeder has stopped reading
        self.set_state({"parent": first, "index": 0, "skip": 0})

    def set_state(self, state: Any) -> None:
        state = expect_state(state, ("parent", "index", "skip"), f"{self!r}")
        # The upstream is restored where it is read: a pool reads it in a thread of its
        # own before the first next(), under its lock, which reset() waits for.
        self._set_at({"parent": state["parent"], "index": int(state["index"]), "skip": int(state["skip"])})
        self._restarted = False
        self._restart([state["parent"]], self._at["index"])

    def _set_at(self, at: dict[str, Any]) -> None:
        """Drops what is in hand; the stream goes on at ``at`` (an element-wise state)."""
        self._at = at
        self._outputs, self._given = [], 0
        self._unit = None
        self._error = self._failed = None
        self._go_on = self._resume = None
        self._ended = False

    def stop_workers(self) -> None:
        """Stops this stage's workers and frees its units, leaving its parent open (a
        stage rebuilt over the same parent replaces it)."""
        if not self._closed:
            self._closed = True
            self._executor.close()
            self._release()

    def close(self) -> None:
        if self._closed:
            return
        self._executor.close()
        self._release()
        super().close()

    def __repr__(self) -> str:
        return f"ShippedElementwiseIterator({' + '.join(op.name for op in self._ops)})"
