"""A ``DataLoader``'s operations from the first packer on, as stages after the engine.

The engine computes the operations before the first packer (read, maps, filters, flat
maps) by position, in worker processes; the packer and everything after it (maps on
rows, a ``Batch`` of rows, ...) depend on the order of the stream, so they run as stages
(:mod:`.packing`, :mod:`.elementwise`) over the engine's ordered output. The packers and
batches run in this process; with workers, the element-wise operations between them run
on a worker pool of their own (:class:`~dataloader.engine.shipped.ShippedElementwiseIterator`:
this process ships the packed rows, 64 at a time, the workers run the maps), with the
output and the states of the element-by-element stage, so states move between worker
counts. The loader's iterator is then :class:`TailIterator`, whose state nests the
stages' states and records the operations it was made for.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

from dataloader.engine.stages.base import DatasetIterator
from dataloader.engine.stages.elementwise import BatchIterator, ElementwiseIterator
from dataloader.errors import StateMismatchError
from dataloader.operations.transforms import GROUP, STREAM
from dataloader.options import MultiprocessingOptions


def _runs(op: Any) -> Any:
    return getattr(op, "runs", None)


def stream_stage(parent: DatasetIterator, op: Any) -> DatasetIterator:
    """The stage that runs a stream operation (a packer, ...) over ``parent``.

    The operation names it (``stage = "module:Class"``, see ``operations.transforms``).

    Raises:
        TypeError: ``op`` does not run on the stream or names no stage.
    """
    path = getattr(op, "stage", None)
    if _runs(op) != STREAM or not isinstance(path, str) or ":" not in path:
        raise TypeError(
            f"{op!r} is not a stream operation: it needs runs = 'stream' and stage = "
            f"'module:Class' naming the DatasetIterator that runs it (as the packers have)"
        )
    module, _, name = path.partition(":")
    stage: DatasetIterator = getattr(importlib.import_module(module), name)(parent, op)
    return stage


def split_at_first_packer(operations: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """The operations before the first stream operation (for the engine), and the rest.

    Raises:
        ValueError: a ``Batch`` comes before a packer (pack sequences, then batch rows).
    """
    operations = list(operations)
    first = next((i for i, op in enumerate(operations) if _runs(op) == STREAM), None)
    if first is None:
        return operations, []
    batches = [i for i, op in enumerate(operations[:first]) if _runs(op) == GROUP]
    if batches:
        raise ValueError(
            f"operations[{batches[0]}] is a Batch before the packer operations[{first}] "
            f"({operations[first].name}); a packer packs single sequences: put the Batch "
            f"after it, to batch the packed rows"
        )
    return operations[:first], operations[first:]


def check_shippable(tail: Sequence[Any]) -> None:
    """With workers, the element-wise operations after a packer go to worker processes:
    checked here, when the loader is made, not at ``iter()``.

    Raises:
        TypeError: one cannot be pickled (named, with the way out).
    """
    import cloudpickle

    for op in tail:
        if _runs(op) in (STREAM, GROUP) or getattr(op, "needs_index", False):
            continue  # run in this process
        try:
            cloudpickle.dumps(op)
        except Exception as exc:
            raise TypeError(
                f"operation {op.name} ({op!r}) after the packer runs in worker processes "
                f"and cannot be sent to them: {type(exc).__name__}: {exc}; make it picklable "
                f"(open files and locks lazily) or use worker_count=0"
            ) from exc


def _name(op: Any) -> str:
    return op.name


class TailIterator(DatasetIterator):
    """The stages of ``tail`` over ``head`` (the engine's iterator); see the module docstring.

    Args:
        head: the loader's engine iterator (operations before the first packer).
        tail: the packer and the operations after it.
        seed: the seed of random maps among them that have no ``rng_seed``.
        workers: the loader's ``worker_count``: with workers (not 0), the element-wise
            operations run on a pool of that many workers; 0: in this process.
        init_fn: the loader's ``worker_init_fn``.
    """

    _stats_name = None  # stats(): it only passes its stages' outputs on

    def __init__(
        self, head: DatasetIterator, tail: Sequence[Any], seed: int | None, workers: Any = 0, init_fn: Any = None
    ) -> None:
        self._tail, self._seed = tuple(tail), seed
        self._workers, self._init_fn = workers, init_fn
        super().__init__(self._stages(head))
        self._head = head
        self._operations = [_name(op) for op in tail]

    def _stages(self, head: DatasetIterator) -> DatasetIterator:
        """Fresh stages of the tail over ``head``."""
        top = head
        group: list[Any] = []
        for op in self._tail:
            if _runs(op) in (STREAM, GROUP):
                if group:
                    top, group = self._elementwise(top, tuple(group)), []
                top = stream_stage(top, op) if _runs(op) == STREAM else BatchIterator(top, op)
            else:
                group.append(op)
        if group:
            top = self._elementwise(top, tuple(group))
        return top

    def _elementwise(self, top: DatasetIterator, ops: tuple[Any, ...]) -> DatasetIterator:
        """The element-wise ``ops`` over ``top``: on a pool with workers (an op that
        needs the stream's order, ``map_with_index``, stays here), else here."""
        if not self._workers or any(getattr(op, "needs_index", False) for op in ops):
            return ElementwiseIterator(top, ops, self._seed)
        from dataloader.engine.shipped import ShippedElementwiseIterator

        options = MultiprocessingOptions(num_workers=self._workers)
        return ShippedElementwiseIterator(top, ops, options, self._init_fn, default_seed=self._seed)

    def _stop_stages(self) -> None:
        """Stops the workers of the stages over the head, leaving the head open."""
        from dataloader.engine.shipped import ShippedElementwiseIterator

        stage: Any = self._parent
        while stage is not self._head and isinstance(stage, DatasetIterator):
            if isinstance(stage, ShippedElementwiseIterator):
                stage.stop_workers()
            stage = stage._parents[0] if len(stage._parents) == 1 else None

    @property
    def head(self) -> DatasetIterator:
        """The engine's iterator under the stages."""
        return self._head

    def __next__(self) -> Any:
        return next(self._parent)

    def get_state(self) -> dict[str, Any]:
        return {"stages": self._parent.get_state(), "stage_operations": self._operations}

    # An Orbax restore on another process count hands set_state every old process's
    # state (dataloader.checkpoint).
    restores_from_every_shard = True

    def set_state(self, state: Any) -> None:
        """Continues from ``state``; given every old host's states (a list), restores
        elastically: the engine reads its share of what they left unread (the records
        of the old packers' open bins included) and the stages start empty."""
        if isinstance(state, (list, tuple)):
            head: Any = self._head  # the engine's iterator, which takes a list of states
            self._stop_stages()  # their pools read the head: stopped before it moves
            head.set_state(list(state))
            self._parents = (self._stages(self._head),)
            return
        if isinstance(state, (str, bytes)):
            import json

            state = json.loads(state)
        if not isinstance(state, dict) or "stages" not in state or "stage_operations" not in state:
            raise StateMismatchError(
                f"this loader packs ({self._operations[0]}), so its states have 'stages' and "
                f"'stage_operations'; got {str(state)[:200]}"
            )
        if state["stage_operations"] != self._operations:
            raise StateMismatchError(
                f"this state was saved for the operations {state['stage_operations']} after the "
                f"engine, but this loader has {self._operations}; keep the operations as they were"
            )
        self._parent.set_state(state["stages"])

    def close(self) -> None:
        super().close()
        self._head.close()
