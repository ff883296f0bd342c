"""Where the engine's iterator goes on from a state: read, checked, and the check's units.

The loader's iterator (:class:`~dataloader.DataLoaderIterator`) keeps iteration and
hands every restore here. :func:`read_state` takes what ``set_state`` was given (a
state dict or its JSON text, a state of Grain's own iterators, a state of the streaming
iterators an engine stream replaces) and parses it once into a
:class:`~dataloader.engine.restore.saved.LoaderState`. :func:`resume` decides the rest,
without touching the iterator: the engine to run (:mod:`.relayout`), the position to go
on from (:func:`~dataloader.engine.state.resolve_state`), the fingerprint check
(:mod:`.verify`; with workers, its units go on into the stream), and the step count.
The iterator applies the :class:`Resumed` value it returns, so a refused restore leaves
it as it was.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from dataloader.engine.fingerprint import KEY
from dataloader.engine.restore import grain, relayout, verify
from dataloader.engine.restore.saved import LoaderState, OldHosts, as_json_value
from dataloader.engine.state import Cursor, make_state, resolve_state


@dataclasses.dataclass(frozen=True)
class Foreign:
    """How an engine's iterator reads states that are not its own.

    Attributes:
        grain_order: whether the stream reads Grain's order (a dataset's iterator is
            told by its dataset); None: judged by the sampler.
        positions_per_index: positions per index of Grain's ``MapDataset`` (its batch
            size when that ``MapDataset`` was batched).
        position_of_state: for a stream on the engine, the position a state of the
            streaming iterators it replaces stands for
            (:mod:`dataloader.dataset.streams.lowering`); None: no such states.
    """

    grain_order: bool | None = None
    positions_per_index: int = 1
    position_of_state: Callable[[dict[str, Any]], int] | None = None


def read_state(engine: Any, state: Any, current: Callable[[], dict[str, Any]]) -> LoaderState:
    """``state`` as a checked :class:`LoaderState` of ``engine``'s stream.

    ``current()`` is the iterator's own state now (what a Grain state is converted
    against: it says what the stream was made for).

    Raises:
        StateMismatchError: naming the invalid field, or why a Grain state cannot be
            continued exactly.
    """
    foreign: Foreign = engine.foreign
    parsed = as_json_value(state)
    if foreign.position_of_state is not None and isinstance(parsed, dict) and "made_for" not in parsed:
        return LoaderState.parse(make_state(engine.plan, Cursor(foreign.position_of_state(parsed))))
    if not grain.is_grain_state(parsed):
        return LoaderState.parse(state)
    mine = current()
    mine.pop(KEY, None)  # it describes this iterator's last step, not Grain's
    if "last_seen_indices" in parsed:
        return LoaderState.parse(grain.from_grain(parsed, mine))
    grain_order = foreign.grain_order
    if grain_order is None:
        grain_order = grain.reads_grains_order(engine.plan.sampler)
    return LoaderState.parse(grain.from_grain_dataset(
        parsed, mine, grain_order=grain_order, positions_per_index=foreign.positions_per_index,
        end=engine.plan.sampler.num_positions,
    ))


@dataclasses.dataclass(frozen=True)
class Resumed:
    """Where an engine's iterator goes on after a restore.

    Attributes:
        engine: the engine to run (the loader's own, or one on an elastic layout).
        cursor: where its stream goes on.
        executor: the executor to go on with (the one given when it still fits, one the
            fingerprint check made), or None: make one at the cursor.
        primed: the check's units from the cursor on, which ``executor`` continues; None:
            the executor is reset to the cursor.
        fingerprint: the restored step's fingerprint (the state's last step, until a
            step is handed out), or None.
        step: steps handed out since the stream's start; None when unknown (a state
            without a fingerprint, or a new elastic layout).
    """

    engine: Any
    cursor: Cursor
    executor: Any = None
    primed: list[Any] | None = None
    fingerprint: dict[str, Any] | None = None
    step: int | None = None


def resume(home: Any, current: Any, executor: Any, saved: LoaderState | OldHosts) -> Resumed:
    """Where an iterator of ``home`` (the loader's engine), now running ``current`` with
    ``executor`` (None: none yet), goes on from ``saved``.

    Every check runs here: what the state was made for, its position, its fingerprint
    (the data and the operations read the same), and for every old host's states their
    share of fingerprints. ``executor`` is used (reset) only when the engine stays; the
    caller applies the result, or on an exception puts its stream back where it was.

    Raises:
        StateMismatchError: the state does not fit, or its fingerprint differs.
    """
    if isinstance(saved, OldHosts):
        engine, single = relayout.for_hosts(home, saved)
        fingerprints = [h.head.fingerprint for h in saved.hosts]
        verify.verify_share(home, fingerprints if single is None else fingerprints[1:])
        if single is None:
            return Resumed(engine, Cursor(0))
        saved = single
    else:
        engine = relayout.for_state(home, current, saved)
    if engine is not current:
        executor = None
    cursor = resolve_state(engine.plan, saved.state)
    fp, primed = saved.fingerprint, None
    if fp is not None and engine.verify_on_restore:
        if engine.in_workers:
            executor, primed = verify.check_on_stream(engine, home, fp, cursor, executor)
        else:
            verify.verify(engine.plan, fp)
    step = fp["step"] if fp is not None else (0 if cursor == Cursor(0) else None)
    return Resumed(engine, cursor, executor, primed, fp, step)
