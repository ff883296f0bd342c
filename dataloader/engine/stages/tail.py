"""A ``DataLoader``'s operations from the first packer on, as stages after the engine.

The engine computes the operations before the first packer (read, maps, filters, flat
maps) by position, in worker processes; the packer and everything after it (maps on
rows, a ``Batch`` of rows, ...) depend on the order of the stream, so they run as stages
(:mod:`.packing`, :mod:`.elementwise`) over the engine's ordered output. The packers and
batches run in this process; with workers, the element-wise operations between them run
on a worker pool of their own (:class:`~dataloader.engine.stages.shipped.ShippedElementwiseIterator`:
this process ships the packed rows, 64 at a time, the workers run the maps), with the
output and the states of the element-by-element stage, so states move between worker
counts. The loader's iterator is then :class:`TailIterator`, whose state nests the
stages' states and records the operations it was made for.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Sequence
from typing import Any

from dataloader.engine.restore.protocol import ElasticDefaults, StatePart
from dataloader.engine.stages.base import DatasetIterator
from dataloader.engine.stages.elementwise import BatchIterator, ElementwiseIterator
from dataloader.errors import StateMismatchError
from dataloader.operations.transforms import GROUP, STREAM, runs_of
from dataloader.options import MultiprocessingOptions


def _runs(op: Any) -> Any:
    return runs_of(op)


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
        TypeError: one cannot be pickled or unpickled (named by its path, with the way
            out; see :mod:`dataloader.engine.pool.pickling`).
    """
    from dataloader.engine.pool.pickling import dumps_checked

    for op in tail:
        if _runs(op) in (STREAM, GROUP) or op.needs_index:
            continue  # run in this process
        dumps_checked(op, "operation", [("operation", op, f"{op.name}, after the packer (it runs in worker processes)")])


def _name(op: Any) -> str:
    return op.name


class TailIterator(DatasetIterator, ElasticDefaults):
    """The stages of ``tail`` over ``head`` (the engine's iterator); see the module docstring.

    Args:
        head: the loader's engine iterator (operations before the first packer).
        tail: the packer and the operations after it.
        seed: the seed of random maps among them that have no ``rng_seed``.
        workers: the loader's ``worker_count``: with workers (not 0), the element-wise
            operations run on a pool of that many workers; 0: in this process.
        init_fn: the loader's ``worker_init_fn``.
        worker_kind: the loader's ``worker_kind``: what those workers are.
    """

    stats_name = None  # stats(): it only passes its stages' outputs on

    def __init__(
        self, head: DatasetIterator, tail: Sequence[Any], seed: int | None, workers: Any = 0, init_fn: Any = None,
        worker_kind: str = "processes",
    ) -> None:
        self._tail, self._seed = tuple(tail), seed
        self._workers, self._init_fn, self._kind = workers, init_fn, worker_kind
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
        if not self._workers or any(op.needs_index for op in ops):
            return ElementwiseIterator(top, ops, self._seed)
        from dataloader.engine.stages.shipped import ShippedElementwiseIterator

        options = MultiprocessingOptions(num_workers=self._workers, worker_kind=self._kind)
        return ShippedElementwiseIterator(top, ops, options, self._init_fn, default_seed=self._seed)

    @property
    def head(self) -> DatasetIterator:
        """The engine's iterator under the stages."""
        return self._head

    def __next__(self) -> Any:
        return next(self._parent)

    def get_state(self) -> dict[str, Any]:
        return {"stages": self._parent.get_state(), "stage_operations": self._operations}

    def set_state(self, state: Any) -> None:
        """Continues from ``state``. Every old host's states (a list) restore elastically
        (the restore room, through :meth:`split_state` and :meth:`restart_elastic`): the
        engine reads its share of what they left unread (the records of the old packers'
        open bins included) and the stages start empty."""
        self._parent.set_state(self._checked(state)["stages"])

    # The elastic-restore protocol (dataloader.engine.restore.protocol.ElasticStage); its
    # restart moves its stages (each restarts empty, the engine on this host's share).

    def split_state(self, state: Any) -> StatePart:
        """The stages' state; an elastic restore may change the batch size (the host
        count's share of the global batch), not the operations."""
        return StatePart(self._checked(state, elastic=True)["stages"])

    def _checked(self, state: Any, elastic: bool = False) -> dict[str, Any]:
        if isinstance(state, (str, bytes)):
            state = json.loads(state)
        if not isinstance(state, dict) or "stages" not in state or "stage_operations" not in state:
            raise StateMismatchError(
                f"this loader packs ({self._operations[0]}), so its states have 'stages' and "
                f"'stage_operations'; got {str(state)[:200]}"
            )
        saved = state["stage_operations"]
        # An elastic restore changes the per-host batch size: a Batch may differ in size.
        same = len(saved) == len(self._operations) and all(
            a == b or (elastic and _runs(op) == GROUP and str(a).startswith("Batch("))
            for a, b, op in zip(saved, self._operations, self._tail)
        )
        if not same:
            raise StateMismatchError(
                f"this state was saved for the operations {state['stage_operations']} after the "
                f"engine, but this loader has {self._operations}; keep the operations as they were"
            )
        return state

    def close(self) -> None:
        super().close()
        self._head.close()
