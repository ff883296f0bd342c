"""The loader's iterator: ordered outputs of a ``DataLoader``, checkpointable at every step.

It is a :class:`DatasetIterator` (``next()``, ``get_state()``, ``set_state()``,
``close()``, ``start_prefetch()``), the protocol every iterator of the package follows
and a user's own iterator subclasses; that protocol lives with the iterator-level
stages, in :mod:`dataloader.engine.stages.base`, and is re-exported here.

The iterator runs a :class:`LoaderEngine`: a frozen value its ``DataLoader`` makes once,
at construction, holding everything the iterator needs (the plan, how to make an
executor, the filter thresholds, the pipeline's description). Values go down: the
iterator never holds or calls its loader, so the loader's settings are read and checked
in one place.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from dataloader.engine import fingerprint, grain_state
from dataloader.engine.assemble import from_position, make_assembler
from dataloader.engine.executor import Executor
from dataloader.engine.plan import BATCH, ELEMENTS, Plan
from dataloader.engine.stages.base import DatasetIterator
from dataloader.engine.state import Cursor, make_state, resolve_state
from dataloader.engine.stats import Counted, FilterWatch, Stats, collect
from dataloader.errors import PipelineError


@dataclasses.dataclass(frozen=True)
class LoaderEngine:
    """What a :class:`DataLoaderIterator` runs, made once by its ``DataLoader``.

    Attributes:
        plan: the engine's :class:`~dataloader.engine.plan.Plan` (source, sampler, the
            operations before the first packer, the units).
        make_executor: ``make_executor(position)``: a new executor of the plan's units
            from local ``position``; in this process or in a worker pool, as the loader
            decided once.
        filter_watch: ``filter_watch()``: a fresh :class:`FilterWatch` (Grain's filter
            thresholds; it counts, so one per restart), or None when nothing is watched.
        pipeline: ``stats()["pipeline"]``, plain JSON values
            (:func:`~dataloader.engine.stats.pipeline.describe_pipeline`).
        in_workers: units are computed in worker processes, so the iterator measures its
            own CPU while it fetches them (what the ``parent_bound`` advice reads); in
            this process the fetching is the computing, which the units time themselves.
        verify_on_restore: a restore from a state with a fingerprint re-reads its last
            step and refuses the state if the records or the operations' output differ
            (:func:`~dataloader.engine.fingerprint.verify`).
        audit_log: a path (``{shard}``: the shard index) to append one JSON line per
            step to (its state and fingerprint), or None.
    """

    plan: Plan
    make_executor: Callable[[int], Executor]
    filter_watch: Callable[[], FilterWatch | None]
    pipeline: Mapping[str, Any]
    in_workers: bool
    verify_on_restore: bool = True
    audit_log: str | None = None


class DataLoaderIterator(DatasetIterator[Any]):
    """Iterates a :class:`~dataloader.DataLoader`; checkpointable at every step.

    ``get_state()`` describes the position after the last output handed out, whatever
    is still being computed or buffered; ``set_state(state)`` continues with the very
    next output in O(1) time, with any worker count.

    Args:
        engine: the loader's :class:`LoaderEngine`; or, as Grain's signature has it, the
            ``DataLoader`` itself, whose engine value is taken (the loader is not kept).
        state: a state from ``get_state`` to start from (or one of Grain's, converted
            as :meth:`set_state` converts it), or every old host's states for an
            elastic restore (see :meth:`set_state`); None: the beginning.

    Example:
        >>> it = iter(loader)                       # doctest: +SKIP
        >>> first = next(it); state = it.get_state()
        >>> it2 = iter(loader); it2.set_state(state)
        >>> # next(it2) equals next(it)
    """

    # stats(): the engine's stages are in its Stats; this iterator adds none of its own.
    _stats_name: str | None = None
    # close() may come from any thread while a next() waits: the executor's close ends
    # that wait at once (Executor's contract), so the device feed closes it first.
    _closes_from_any_thread = True

    def __init__(self, engine: LoaderEngine | Any, state: Any = None) -> None:
        super().__init__()
        if not isinstance(engine, LoaderEngine):
            engine = _engine_of(engine)
        self._engine = self._home = engine  # home: the plain sharding, before any elastic restore
        self._plan = engine.plan
        self._executor: Executor | None = None
        self._assembler: Any = None
        self._closed = False
        self._stats = Stats()
        self._stats_batches = self._plan.batch is not None
        self._pipeline = engine.pipeline
        # Steps handed out since the stream's start (None: unknown, after a restore from
        # a state without a fingerprint), and the fingerprint a restore brought.
        self._step: int | None = 0
        self._restored: dict[str, Any] | None = None
        self._log: Any = None
        cursor = Cursor(0)
        if state is not None:
            states, state = state, self._relayout(state)
            self._verify_others(states, state)
        if state is not None:
            # Grain's states are converted as set_state converts them, against this
            # iterator's state at the beginning (there is no assembler yet to ask).
            state = self._from_grain(state, make_state(self._plan, Cursor(0)))
            cursor = self._resolve(state)
        self._restart(cursor)

    def _resolve(self, state: Any) -> Cursor:
        """Where ``state`` continues, after its fingerprint is checked against the data."""
        cursor = resolve_state(self._plan, state)
        fp = fingerprint.fingerprint_of(state)
        if fp is not None and self._engine.verify_on_restore:
            if self._engine.in_workers:
                self._check_in_workers(fp, cursor)
            else:
                fingerprint.verify(self._plan, fp)
        self._restored = fp
        self._step = fp["step"] if fp is not None else (0 if cursor == Cursor(0) else None)
        return cursor

    def _check_in_workers(self, fp: dict[str, Any], cursor: Cursor) -> None:
        """The fingerprint check with workers: no user code runs in this process (docs/design.md,
        "Where user code runs"). The executor starts at the step's first position and
        its workers compute the step's units with their digests; the units from
        ``cursor`` on are kept for the stream (:attr:`_primed`), so the check costs
        about one unit and the stream goes on as if restored directly. A step that is
        not a run of this stream's positions (a state of another host count) is
        computed by an executor of its own (:func:`fingerprint.verify_on_executor`)."""
        plan, start, count = self._plan, fp["local_start"], fp["count"]
        try:
            here = plan.sampler.global_positions(np.arange(start, start + count, dtype=np.int64))
            own = plan.fingerprint and np.array_equal(here, fingerprint.global_positions(fp))
        except IndexError:  # beyond this stream's end
            own = False
        if not own:
            fingerprint.verify_on_executor(self._home, [fp])
            return
        before = None if self._assembler is None else (self._assembler.state(), self._fingerprint())
        try:
            if self._executor is None:
                self._executor = self._engine.make_executor(start)
            else:
                self._executor.reset(start)
            units = fingerprint.covering(self._executor, start, count)
            sources, output = fingerprint.from_units(fp, units, start)
            fingerprint.compare(plan, fp, sources, output)
        except BaseException:
            if before is not None:  # a refused set_state leaves the iterator where it was
                self._restart(before[0])
                self._restored = before[1]
            elif self._executor is not None:  # a refused construction leaves no workers up
                self._executor.close()
                self._executor = None
            raise
        # The units from the cursor on are the stream's (one that starts there, or the
        # next the executor makes, or the rest of one the cursor is inside); else (a
        # cursor past the checked units, or a batch unit the cursor is inside: not on
        # its grid) the stream is computed from the cursor. Units past the checked ones
        # are not pulled here: one of them may hold an error the state steps over.
        starts = [r.start for r in units]
        if cursor.position in starts:
            self._primed = units[starts.index(cursor.position):]
        elif units and units[-1].stop == cursor.position and units[-1].error is None:
            self._primed = []
        elif plan.layout != BATCH:  # the cursor inside a unit (sizing cuts anywhere): its rest
            inside = [i for i, r in enumerate(units) if r.start < cursor.position < r.stop]
            if inside:
                self._primed = [from_position(units[inside[0]], cursor.position), *units[inside[0] + 1 :]]

    def _restart(self, cursor: Cursor) -> None:
        engine = self._engine
        primed, self._primed = self._primed, None
        units: Any = self._executor
        if self._executor is None:
            self._executor = units = engine.make_executor(cursor.position)
        elif primed is None:
            self._executor.reset(cursor.position)  # keeps worker processes up
        else:
            units = itertools.chain(primed, self._executor)  # the fingerprint check's units
        self._assembler = make_assembler(
            self._plan,
            Counted(units, self._stats, engine.filter_watch(), engine.in_workers),
            cursor, self._stats.seconds,
        )

    def __iter__(self) -> DataLoaderIterator:
        return self

    def __next__(self) -> Any:
        if self._closed:
            raise StopIteration
        resume, self._resume = self._resume, None
        if resume is not None:
            self._restart(resume)
        try:
            out = self._assembler.next()
        except PipelineError as exc:
            # An element stream goes on with the record after the failing one (as a
            # dataset iterated in order does), wherever the units were cut; the work in
            # flight is dropped, on this path only.
            if self._plan.layout == ELEMENTS and exc.position is not None:
                self._resume = Cursor(exc.position + 1)
                self._restored = self._fingerprint()  # the new assembler has no last step
            raise
        if self._step is not None:
            self._step += 1
        if self._engine.audit_log is not None:
            self._write_audit_line()
        return out

    def _fingerprint(self) -> dict[str, Any] | None:
        """The last step's fingerprint (the restored one until a step is handed out)."""
        last = self._assembler.last_step()
        if last is None:
            return self._restored
        units, segments, output_index = last
        return fingerprint.of_step(self._plan, units, segments, self._step, output_index)

    def _write_audit_line(self) -> None:
        state = self.get_state()
        fp = state.pop("fingerprint", None)
        made_for = state.pop("made_for")
        if self._log is None:
            path = str(self._engine.audit_log).replace("{shard}", str(made_for["shard_index"]))
            self._log = open(path, "a", buffering=1)  # noqa: SIM115 (closed by close())
        state["shard"] = made_for["shard_index"]
        state["step"] = self._step
        state["fingerprint"] = None if fp is None else fingerprint.describe(self._plan, fp)
        self._log.write(json.dumps(state, separators=(",", ":")) + "\n")

    def get_state(self) -> dict[str, Any]:
        """A small JSON-able dict: the position after the last output handed out, and
        the fingerprint of that output's records (:mod:`dataloader.engine.fingerprint`)."""
        state = make_state(self._plan, self._assembler.state())
        fp = self._fingerprint()
        if fp is not None:
            state[fingerprint.KEY] = fp
        return state

    def set_state(self, state: Any) -> None:
        """Continues from ``state`` (a dict from ``get_state``, or its JSON text).

        Given a list of every old host's states (of one step, on another host count,
        this loader built as one host of the new count), it reads this host's share of
        what they left unread: each record of the stream exactly once across the change,
        for every pipeline (docs/elastic-restore.md, :mod:`dataloader.engine.elastic`).

        Raises:
            StateMismatchError: the state was made for another data set, seed, sharding
                or pipeline; the message names each difference. Or its fingerprint
                does not match what its last step's records read now (the records whose
                bytes changed, or the operations' output), unless the loader was made
                with ``verify_on_restore=False``.

        A state of Grain's own iterators (its DataLoader's, or a dataset iterator's
        ``{"next_index": n}`` as MaxText checkpoints hold) is converted first where
        granary continues it exactly, and refused saying why otherwise
        (:mod:`dataloader.engine.grain_state`).
        """
        states, state = state, self._relayout(state)
        self._verify_others(states, state)
        self._restart(self._resolve(self._from_grain(state)) if state is not None else Cursor(0))
        self._resume = None
        self._closed = False

    def _verify_others(self, states: Any, state: Any) -> None:
        """Given every old host's states, checks this host's share of them
        (:meth:`_verify_share`): all of them when they call for a new layout (``state``
        None), else those besides ``states[0]``, the one this host restores (and checks)."""
        if isinstance(states, (list, tuple)):
            self._verify_share(states if state is None else states[1:])

    def _verify_share(self, states: list[Any] | tuple[Any, ...]) -> None:
        """An elastic restore from every old host's states: new host ``j`` of ``H'`` checks
        the fingerprints of old states ``j, j + H', ...``, so each is checked once across
        the new hosts, about one batch per host (:func:`fingerprint.verify`; with workers,
        all on one executor of their own, :func:`fingerprint.verify_on_executor`)."""
        if not self._engine.verify_on_restore:
            return
        shards = self._home.plan.sampler.shard_options
        share = list(states)[shards.shard_index :: shards.shard_count]
        fps = [fp for fp in map(fingerprint.fingerprint_of, share) if fp is not None]
        if self._home.in_workers:  # user code in workers only
            fingerprint.verify_on_executor(self._home, fps)
        else:
            for fp in fps:
                fingerprint.verify(self._home.plan, fp)

    # An Orbax restore on another process count hands set_state every old process's
    # state (dataloader.checkpoint).
    restores_from_every_shard = True

    def _relayout(self, state: Any) -> Any:
        """Moves onto the layout an elastic restore calls for (``state``: every old host's
        states, or a state an elastic restore made; :mod:`dataloader.engine.elastic`)
        and returns the state to resolve there (None: the layout's start)."""
        from dataloader.engine import elastic

        engine, state = elastic.engine_for(self._home, self._engine, state)
        if engine is not self._engine:
            if self._executor is not None:
                self._executor.close()
                self._executor = None
            self._engine, self._plan = engine, engine.plan
        if state is None:
            self._step, self._restored = None, None  # steps since the stream's start: unknown
        return state

    # Set by the dataset that to_iter_dataset() made (None: a DataLoader's, judged by its
    # sampler): whether the stream reads Grain's order, and positions per index of
    # Grain's MapDataset (its batch size when that MapDataset was batched).
    _grain_order: bool | None = None
    # After a PipelineError of an element stream: where the next next() starts.
    _resume: Cursor | None = None
    # After a fingerprint check in workers: its units from the restored cursor on, which
    # the executor (not reset) continues (see _check_in_workers).
    _primed: list[Any] | None = None
    _grain_positions_per_index = 1

    def _from_grain(self, state: Any, current: dict[str, Any] | None = None) -> Any:
        """``state`` as granary's if it is one of Grain's (see :meth:`set_state`);
        ``current`` is this iterator's own state (None: ``get_state()``)."""
        parsed = state
        if isinstance(state, (str, bytes)):
            try:
                parsed = json.loads(state)
            except ValueError:
                return state  # resolve_state says what is wrong with it
        if not grain_state.is_grain_state(parsed):
            return state
        if current is None:
            current = self.get_state()
            current.pop(fingerprint.KEY, None)  # it describes this iterator's last step
        if "last_seen_indices" in parsed:
            return grain_state.from_grain(parsed, current)
        grain_order = self._grain_order
        if grain_order is None:
            grain_order = grain_state.reads_grains_order(self._plan.sampler)
        return grain_state.from_grain_dataset(
            parsed, current, grain_order=grain_order,
            positions_per_index=self._grain_positions_per_index, end=self._plan.sampler.num_positions,
        )

    def _outputs_per_position(self) -> int | None:
        """Positions per output when that is fixed (a plain batch, or maps only)."""
        plan = self._plan
        if plan.layout == BATCH and not plan.post:
            return plan.batch.batch_size if plan.batch is not None else 1
        if plan.layout == ELEMENTS and not any(s.op.reshapes for s in plan.pre):
            return 1
        return None

    def _get_next_index(self) -> int:
        per = self._outputs_per_position()
        if per is None:
            return super()._get_next_index()
        return -(-self._assembler.state().position // per)

    def _set_next_index(self, index: int) -> None:
        per = self._outputs_per_position()
        if per is None:
            return super()._set_next_index(index)
        self.set_state(make_state(self._plan, Cursor(int(index) * per)))

    def start_prefetch(self) -> None:
        """Starts computing units before the first ``next()`` (workers start at once anyway;
        in-process, a thread computes the first units while the model restores)."""
        start = getattr(self._executor, "start_prefetch", None)
        if start is not None:
            start()

    def _stats_totals(self) -> dict[str, Any]:
        """The engine's totals, with what this iterator handed out and waited."""
        totals = self._stats.totals(time.monotonic())
        clock = collect.clock_of(self)
        if self._stats_batches:
            totals["elements_out"], totals["batches_out"] = self._stats.elements, clock.outputs
        else:
            totals["elements_out"] = clock.outputs
        totals["wait_s"] = clock.wait_s()
        return totals

    def _stats_pipeline(self) -> dict[str, Any]:
        pipeline = dict(self._pipeline)
        if self._stats.pipe_units:  # for the advice: how much memory result blocks have left
            from dataloader.engine.pool.shm import block_room

            room = block_room()
            if room is not None:
                pipeline["shm_free_mb"] = room / 2**20
        return pipeline

    @property
    def unit_stats(self) -> Stats:
        """The engine's per-unit counters and log (what the report's timeline reads)."""
        return self._stats

    def close(self) -> None:
        """Stops all background work; safe to call more than once."""
        self._closed = True
        if self._executor is not None:
            self._executor.close()
        if self._log is not None:
            self._log.close()
            self._log = None


def _engine_of(loader: Any) -> LoaderEngine:
    """The engine value of a ``DataLoader`` (Grain's ``DataLoaderIterator(loader, state)``)."""
    engine = getattr(loader, "engine", None)
    if not isinstance(engine, LoaderEngine):
        raise TypeError(
            f"DataLoaderIterator needs a DataLoader (or its .engine), got "
            f"{type(loader).__name__}: {loader!r}; iterate the loader (iter(loader)) instead"
        )
    return engine


def elastic_iterator(loader: Any, states: Any) -> DatasetIterator:
    """An iterator of ``loader`` (this host's shard of a new host count) that reads what
    the old hosts left unread: each record of the stream exactly once across the change.

    Args:
        loader: this host's ``DataLoader``, built with the new ``ShardOptions(j, H')``
            (any batch size, worker count; the same data, order and operations).
        states: every old host's ``get_state()`` of one step (a list, any order: e.g.
            every process's file of an Orbax checkpoint); or one state that an elastic
            restore made, to go on with it on the same host count.

    Returns:
        ``loader.iterator(states)``, which takes such states too (and an Orbax restore
        on another process count hands them to ``set_state``); its states record the
        layout (see :mod:`dataloader.engine.elastic`) and restore the same way again.
    """
    return loader.iterator(states)
