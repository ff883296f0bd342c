"""The execution plan: how a pipeline's stream is cut into work units.

A unit is a range ``[start, stop)`` of local positions (positions in this shard's
stream). Its result is a pure function of the range, so any process can compute any
unit, a lost unit is simply computed again, and the output never depends on how many
workers there are. Three layouts, chosen from the operations:

``batch``
    A ``Batch`` with only maps and random maps before it (the common case). A unit is
    exactly one batch, ``[k*B, (k+1)*B)``; the worker reads, maps, stacks and applies the
    operations after the batch, and the parent only hands the result on.
``elements``
    No ``Batch``. A unit is a range of positions; its outputs are elements, each
    tagged with the position it came from and its rank among that position's outputs
    (``sub``, non-zero only after a flat map).
``regroup``
    A filter or flat map before the ``Batch``. Units are as in ``elements``; the parent
    regroups the surviving elements into batches and applies the operations after the
    batch. Batch composition depends only on the order of survivors, never on unit
    boundaries, so the unit size is free.

Under ``elements`` and ``regroup``, ``unit_size`` is the *grid* the states are defined
on (128 positions, or the batch size, unless ``ReadOptions(unit_size=...)`` says
otherwise). A user's ``unit_size`` is also every unit's size; by default units are
sized by what they cost instead (``adaptive``, :mod:`~dataloader.engine.sizing`): the
first is one position, so the first element costs one element.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from dataloader.engine.sizing import MAX_UNIT_POSITIONS, Units, UnitSizer, sized_ranges
from dataloader.operations import Batch, Operation
from dataloader.operations.transforms import ELEMENT, GROUP, resolve_seed, runs_of
from dataloader.samplers import Sampler

BATCH, ELEMENTS, REGROUP = "batch", "elements", "regroup"
DEFAULT_UNIT_SIZE = 128

_KINDS = "MapTransform, RandomMapTransform, FilterTransform, FlatMapTransform or Batch"


@dataclasses.dataclass(frozen=True)
class Step:
    """One element-wise operation, its stream number (its index in the pipeline) and seed.

    The seed and stream number key the per-element generators of a random map (so
    adding an operation elsewhere does not change another one's randomness): the seed
    is the operation's own ``rng_seed`` when it has one, else the sampler's, and
    ``None`` for the other operations.
    """

    op: Operation
    stream: int
    seed: int | None
    # The operation's per-element callable, looked up once (not per element or unit).
    fn: Callable[..., Any] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fn", self.op.element_fn())


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything a process needs to compute any unit. Picklable (with cloudpickle).

    ``unit_size``: positions per unit, and under ``elements``/``regroup`` the grid the
    states are defined on. ``adaptive``: units are sized by what they cost, within
    that grid (see :meth:`units`). ``fingerprint``: units also carry digests of their
    records and outputs (:mod:`~dataloader.engine.fingerprint`), for the states.
    """

    source: Any
    sampler: Sampler
    pre: tuple[Step, ...]
    batch: Batch | None
    post: tuple[Step, ...]
    layout: str
    unit_size: int
    adaptive: bool = False
    fingerprint: bool = False

    @property
    def num_positions(self) -> int | None:
        return self.sampler.num_positions

    @property
    def operation_names(self) -> list[str]:
        names = [s.op.name for s in self.pre]
        if self.batch is not None:
            names.append(self.batch.name)
        return names + [s.op.name for s in self.post]

    @property
    def positions_per_output(self) -> int | None:
        """Positions per output when that is fixed (a plain batch, or maps only): what
        Grain's next index of an output counts; None when filters or flat maps decide."""
        if self.layout == BATCH and not self.post:
            return self.batch.batch_size if self.batch is not None else 1
        if self.layout == ELEMENTS and not any(s.op.reshapes for s in self.pre):
            return 1
        return None

    def units(self, position: int) -> Units:
        """Unit ranges from ``position`` to the end of the stream (for ever if infinite).

        Fixed-size units stay aligned to multiples of ``unit_size`` after a restore
        mid-unit (the first one is shorter). Adaptive ones start at one position and
        grow while the units the executor reports to :meth:`Units.observe` are cheap
        and small, inside the same grid; the states do not depend on either.
        """
        if self.adaptive:
            cap = max(self.unit_size, MAX_UNIT_POSITIONS // self.unit_size * self.unit_size)
            sizer = UnitSizer(cap)
            return Units(sized_ranges(position, self.num_positions, self.unit_size, sizer), sizer)
        return Units(self._fixed_units(position))

    def _fixed_units(self, position: int) -> Iterator[tuple[int, int]]:
        end = self.num_positions
        step = self.unit_size
        start = position
        while end is None or start < end:
            stop = (start // step + 1) * step
            if end is not None and stop > end:
                # A unit of the batch layout is the batch that starts at stop - step.
                if self.layout == BATCH and self.batch is not None and not self.batch.keeps(end - stop + step):
                    return
                stop = end
            yield start, stop
            start = stop


def make_plan(
    source: Any, sampler: Sampler, operations: Sequence[Any], unit_size: int | None = None
) -> Plan:
    """Validates ``operations`` and chooses the unit layout.

    ``unit_size``: every unit's size under the ``elements`` and ``regroup`` layouts
    (``ReadOptions.unit_size``); None: units sized by what they cost, on a grid of
    :data:`DEFAULT_UNIT_SIZE` positions (the batch size under ``regroup``).

    Raises:
        TypeError: an operation is not one of the operation types.
        ValueError: more than one ``Batch``, or a random map without a seed.
    """
    pre: list[Step] = []
    post: list[Step] = []
    batch: Batch | None = None
    for i, op in enumerate(operations):
        runs = runs_of(op)
        if runs == GROUP:
            if batch is not None:
                raise ValueError(
                    f"operations[{i}] is a second Batch ({op.name}); a pipeline takes one "
                    f"Batch (put the operations that need bigger groups in its batch_fn)"
                )
            batch = op
            continue
        # The engine computes by position: it runs element operations that need no index
        # (an element's index in the stream is only known in order).
        if runs != ELEMENT or op.needs_index:
            hint = f"; wrap it as MapTransform({getattr(op, '__name__', 'fn')})" if callable(op) else ""
            raise TypeError(f"operations[{i}] is {op!r}, expected a {_KINDS}{hint}")
        seed = resolve_seed(op, sampler.seed, f"operations[{i}] ")
        (post if batch is not None else pre).append(Step(op, i, seed))
    reshapes = any(s.op.reshapes for s in pre)
    if batch is None:
        layout, size = ELEMENTS, unit_size or DEFAULT_UNIT_SIZE
    elif reshapes:
        layout, size = REGROUP, unit_size or batch.batch_size
    else:
        layout, size = BATCH, batch.batch_size
    # A user's unit_size is every unit's size, as asked; by default units are sized by
    # what they cost (one batch is one unit under the batch layout).
    adaptive = layout != BATCH and unit_size is None
    return Plan(source, sampler, tuple(pre), batch, tuple(post), layout, size, adaptive)
