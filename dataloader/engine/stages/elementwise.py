"""Element-wise stages over an ordered stream: map, random map, filter, flat map, batch.

These are the iterators behind element-wise calls chained after an iterator-level
stage (packing, interleaving, a user's dataset) and behind a ``DataLoader``'s operations
after a packer: they run in the consumer's process on the ordered stream of their
parent.

Consecutive element-wise operations share one stage, as on the engine: element ``i`` of
the parent stream carries the tags ``(i, sub)`` (``sub`` numbers the outputs of a flat
map) and a random map draws from ``record_rng(seed, i, operation number, sub)``. The
state is the parent's state plus the count of parent elements consumed; after a flat
map whose outputs are only partly handed out, it is the parent's state *before* that
element and how many of its outputs were handed out (restoring recomputes one element).
A batch pulls exactly its elements, so its state is its parent's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from dataloader.engine.compute import apply_element_ops, call_user
from dataloader.engine.plan import Step
from dataloader.engine.restore.protocol import ElasticDefaults, StatePart, tag_reader
from dataloader.engine.stages.base import DatasetIterator, expect_state
from dataloader.errors import PipelineError, StateMismatchError
from dataloader.operations import Batch, Operation
from dataloader.operations.transforms import MANY, resolve_seed
from dataloader.samplers import RecordRngFactory


class ElementwiseIterator(DatasetIterator, ElasticDefaults):
    """Pulls one parent element at a time and runs the operations on it."""

    def __init__(
        self,
        parent: DatasetIterator,
        ops: tuple[Operation, ...],
        default_seed: int | None = None,
        watch: Any = None,
    ) -> None:
        super().__init__(parent)
        self.stats_name = " + ".join(op.name for op in ops)  # its seconds in stats()
        self._watch = watch  # a FilterWatch: Grain's filter thresholds
        self._steps = tuple(
            Step(op, stream, resolve_seed(op, default_seed)) for stream, op in enumerate(ops)
        )
        self._rngs: dict[int, RecordRngFactory] = {}  # kept across elements
        self._expands = any(op.returns == MANY for op in ops)
        self.reshapes = any(op.reshapes for op in ops)  # not one output per parent element
        self._index = 0  # parent elements consumed
        self._pending: list[Any] = []  # outputs of the last parent element
        self._given = 0  # how many of them were handed out
        self._before: Any = None  # the parent's state before the last element (flat maps)
        self._parent_tag = tag_reader(parent)

    def __next__(self) -> Any:
        while self._given == len(self._pending):
            if self._expands:
                self._before = self._parent.get_state()
            element = next(self._parent)
            self._index += 1
            self._pending = self._apply(element, self._index - 1)
            self._given = 0
            if self._watch is not None:
                self._watch.add(1, 0 if self._pending else 1)
        item = self._pending[self._given]
        self._pending[self._given] = None  # handed out: not kept alive here
        self._given += 1
        return item

    def _apply(self, element: Any, index: int) -> list[Any]:
        out, _, _ = apply_element_ops(self._steps, [element], None, None, index, self._fail, rngs=self._rngs)
        return out

    # The elastic-restore protocol (dataloader.engine.restore.protocol.ElasticStage).

    def last_tag(self) -> Any:
        """The engine's (position, sub) of the element handed out last, through a parent
        that says it, when each output is one parent element (no flat map); else None."""
        return None if self._expands else self._parent_tag()

    def split_state(self, state: Any) -> StatePart:
        return element_part(state, f"{self!r}")

    def restart_elastic(self, resume: Callable[[], None], kept: Sequence[Any]) -> None:
        resume()  # the parent restarts on this host's share, empty
        self.restart_at(0)

    def _fail(self, op: Operation, index: int, sub: int, exc: BaseException) -> BaseException:
        return PipelineError(
            f"{op.name} failed on element {index} of the stream of {self._parent!r}"
            f"{f' (output {sub})' if sub else ''}: {type(exc).__name__}: {exc}",
            operation=op.name,
            position=index,
        )

    def restart_at(self, index: int) -> None:
        """Continues as if ``index`` parent elements were consumed (the parent was moved
        there): nothing pending, the next element's index is ``index``."""
        self._index, self._pending, self._given = int(index), [], 0

    def get_state(self) -> dict[str, Any]:
        if self._given < len(self._pending):
            return {"parent": self._before, "index": self._index - 1, "skip": self._given}
        return {"parent": self._parent.get_state(), "index": self._index, "skip": 0}

    def set_state(self, state: Any) -> None:
        state = expect_state(state, ("parent", "index", "skip"), f"{self!r}")
        self._parent.set_state(state["parent"])
        self._index, skip = int(state["index"]), int(state["skip"])
        self._pending, self._given = [], 0
        if skip:
            self._before = state["parent"]
            self._pending = self._apply(next(self._parent), self._index)
            self._index += 1
            self._given = skip


class BatchIterator(DatasetIterator, ElasticDefaults):
    """Pulls ``batch_size`` elements and stacks them; its state is the parent's. In an
    elastic restore it holds nothing (it pulls exactly its elements)."""

    stats_batches = True  # stats(): its outputs are batches of its parent's elements

    def __init__(self, parent: DatasetIterator, batch: Batch) -> None:
        super().__init__(parent)
        self.stats_name = batch.name
        self._batch = batch
        self._end: Any = None  # the parent's state where the stream ended

    def __next__(self) -> Any:
        if self._end is not None:
            raise StopIteration
        # A dropped remainder hands nothing out, so the state stays where it was.
        start = self._parent.get_state() if self._batch.drop_remainder else None
        elements = []
        for _ in range(self._batch.batch_size):
            try:
                elements.append(next(self._parent))
            except StopIteration:
                break
        if not self._batch.keeps(len(elements)):
            self._end = start if start is not None else self._parent.get_state()
            raise StopIteration
        return call_user(
            self._batch.name, lambda: f"on a batch of the stream of {self._parent!r}", self._batch.batch_fn, elements
        )

    def get_state(self) -> dict[str, Any]:
        return {"parent": self._end if self._end is not None else self._parent.get_state()}

    def set_state(self, state: dict[str, Any]) -> None:
        self._parent.set_state(expect_state(state, ("parent",), f"{self!r}")["parent"])
        self._end = None

    def split_state(self, state: Any) -> StatePart:
        return StatePart(expect_state(state, ("parent",), f"{self!r}")["parent"])

    def restart_elastic(self, resume: Callable[[], None], kept: Sequence[Any]) -> None:
        resume()
        self._end = None


def element_part(state: Any, where: str) -> StatePart:
    """The :class:`StatePart` of an element-wise stage's state (``where``: its name): its
    parent's state; refused inside one element's outputs (``skip``), which an elastic
    restore cannot split between hosts."""
    state = expect_state(state, ("parent", "index", "skip"), where)
    if state["skip"]:
        raise StateMismatchError(
            f"this state holds records in a stage ({where}, {{'skip': {state['skip']}}}) that it "
            f"does not name as positions, so an elastic restore would lose or repeat them: an "
            f"element-wise stage inside one element's outputs; save at another step or restore "
            f"on the same host count"
        )
    return StatePart(state["parent"])
