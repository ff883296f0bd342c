"""How an iterated stage's elements become units: the parent reads them, in order, as the
pool asks for each unit's range (:class:`Feeder`), and plans the units over them.

Position ``p`` of such a stream is the stage's ``p``-th element; units are runs of
``unit_size`` consecutive elements, a grid that does not depend on the worker count, so
a unit is computed by the very function that computes every unit
(:func:`~dataloader.engine.compute.compute_unit`): the output, the random generators
(keyed by ``p``), the errors and the crash recovery are those of any other unit. The
elements reach the workers through :class:`~dataloader.engine.shipped_inputs.ShippedInputs`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from dataloader.engine.plan import ELEMENTS, Plan, Step
from dataloader.engine.restore.protocol import no_tag, tag_reader
from dataloader.engine.shipped_inputs import ShippedInputs
from dataloader.engine.sizing import Units
from dataloader.operations import Operation
from dataloader.operations.transforms import resolve_seed
from dataloader.samplers.view import ElementOrder

# Elements of the iterated stage per unit: a fixed grid, whatever the worker count.
UNIT_SIZE = 64


class Feeder:
    """Reads the upstream iterator unit by unit, storing each unit's elements (and the
    upstream's state before them) as the executor asks for the unit's range.

    ``error``: the exception the upstream raised, at position ``error_at`` (the units
    end before it; the consumer raises it once the elements before it are out).
    """

    def __init__(self, upstream: Any, inputs: ShippedInputs) -> None:
        self.upstream = upstream
        self.inputs = inputs
        # unit start -> (the upstream's state before each of its elements, and after
        # the last one, None after an error)
        self.states: dict[int, tuple[list[Any], Any]] = {}
        self.tags: dict[int, list[Any]] = {}  # unit start -> its elements' engine tags (elastic)
        self.error: BaseException | None = None
        self.error_at = 0
        self.error_state: Any = None  # the upstream's state after it raised
        self.end_at = 0
        self.end_state: Any = None  # the upstream's state once it ended
        self._restore: list[Callable[[], None]] = []  # what moves the upstream back, once
        self._tag = tag_reader(upstream)

    def restore(self, move: Callable[[], None]) -> None:
        """Calls ``move()`` (which puts the upstream where the stream restarts: its
        ``set_state``, or an elastic restore's resume) when the next stream of ranges is
        read: in the thread that reads it (a pool reads ahead in a thread of its own,
        under its lock)."""
        self._restore = [move]

    def ranges(self, position: int) -> Iterator[tuple[int, int]]:
        """The unit ranges from ``position`` on, reading the upstream as they are asked for.

        Called by the executor's ``reset`` (under the pool's lock): the restore asked for
        is bound here, to this stream, never to one the pool was still reading.
        """
        restore = self._restore[:1]
        self._restore = []
        return self._read(position, restore)

    def _read(self, position: int, restore: list[Any]) -> Iterator[tuple[int, int]]:
        step, start = self.inputs.unit_size, position
        # Nothing of the previous stream is kept: its units will not be asked for again.
        self.inputs.drop_all()
        self.states.clear()
        self.tags.clear()
        self.error = None
        if restore:
            restore[0]()
        # Read per element in this loop, which runs in the trainer: bound once. An
        # upstream with no engine tags gives a unit none (the stage reads None for each).
        upstream, state_of, tagged = self.upstream, self.upstream.get_state, self._tag is not no_tag
        while True:
            # The state before every element, not only the unit's first: a state handed
            # out mid-unit then names the very element it stands before, as the
            # element-by-element stage's does, so it still means that element when the
            # stage is rebuilt otherwise (a mixture restored with other weights).
            befores: list[Any] = []
            after: Any = None
            want = (start // step + 1) * step - start
            elements: list[Any] = []
            tags: list[Any] = []
            try:
                for _ in range(want):
                    befores.append(state_of())
                    elements.append(next(upstream))
                    if tagged:
                        tags.append(self._tag())
                after = state_of()
            except StopIteration:
                after = befores.pop()
                self.end_at, self.end_state = start + len(elements), self.upstream.get_state()
                want = -1
            except Exception as exc:  # handed to the consumer at its place
                after = befores.pop()
                self.error, self.error_at, want = exc, start + len(elements), -1
                self.error_state = _state_or(self.upstream, after)
            if elements:
                self.states[start] = (befores, after)
                self.tags[start] = tags
                self.inputs.put(start, elements)
                yield start, start + len(elements)
            if want < 0:
                return
            start += len(elements)


def go_on_after(befores: list[Any], after: Any, start: int, failed: int) -> tuple[list[Any], int]:
    """Where a stream goes on after its element ``failed`` failed, in the unit at
    ``start`` whose upstream states are ``befores``, ``after``: (the upstream's state
    after that element, the next element's index)."""
    return [befores[failed + 1 - start] if failed + 1 - start < len(befores) else after], failed + 1


def _state_or(upstream: Any, default: Any) -> Any:
    """The upstream's state after it raised, or ``default`` if it cannot tell."""
    try:
        return upstream.get_state()
    except Exception:  # a stage broken by its own error: the state before it
        return default


class FedPlan(Plan):
    """A plan whose units come from a :class:`Feeder` (the parent's copy; the workers
    get the plain :class:`Plan` with the same source, steps and grid)."""

    feeder: Any = None

    def units(self, position: int) -> Units:
        return Units(self.feeder.ranges(position))


def shipped_plans(
    ops: tuple[Operation, ...], inputs: ShippedInputs, feeder: Feeder, default_seed: int | None = None
) -> tuple[Plan, Plan]:
    """The parent's plan and the workers' plan for ``ops`` over shipped elements.

    The steps are those of the element-by-element stage (operation ``i`` is stream
    ``i``, seeded by its own ``rng_seed``, the one ``random_map`` gave it, else
    ``default_seed``), so the random generators and the output are the same either way.
    """
    steps = tuple(Step(op, i, resolve_seed(op, default_seed)) for i, op in enumerate(ops))
    plan = Plan(inputs, ElementOrder(), steps, None, (), ELEMENTS, inputs.unit_size)
    fed = FedPlan(inputs, ElementOrder(), steps, None, (), ELEMENTS, inputs.unit_size)
    object.__setattr__(fed, "feeder", feeder)
    return fed, plan
