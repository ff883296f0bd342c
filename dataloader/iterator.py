"""The loader's iterator: ordered outputs of a ``DataLoader``, checkpointable at every step.

A :class:`DatasetIterator` (:mod:`dataloader.engine.stages.base`) that runs a
:class:`LoaderEngine`, the frozen value its ``DataLoader`` makes once: values go down,
the iterator never holds or calls its loader. It keeps iteration; every restore (one
state, every old host's states, Grain's, the fingerprint check) is the restore room's
(:mod:`dataloader.engine.restore`), whose result it applies.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable, Mapping
from typing import Any

from dataloader.engine import fingerprint
from dataloader.engine.assemble import make_assembler
from dataloader.engine.executor import ExecutorMaker, Prefetching
from dataloader.engine.plan import ELEMENTS, Plan
from dataloader.engine.restore.every_host import restore_every_host
from dataloader.engine.restore.resume import Foreign, Resumed, read_state, resume
from dataloader.engine.stages.base import DatasetIterator
from dataloader.engine.state import Cursor, make_state
from dataloader.engine.stats import Counted, FilterWatch, Stats, collect
from dataloader.errors import PipelineError


@dataclasses.dataclass(frozen=True)
class LoaderEngine:
    """What a :class:`DataLoaderIterator` runs, made once by its ``DataLoader``.

    Attributes:
        plan: the :class:`~dataloader.engine.plan.Plan` (source, sampler, operations, units).
        make_executor: ``make_executor(position)``: a new executor of the plan's units,
            of the kind the loader chose (:class:`~dataloader.engine.executor.ExecutorMaker`).
        filter_watch: ``filter_watch()``: a fresh :class:`FilterWatch` or None.
        pipeline: ``stats()["pipeline"]``, plain JSON values.
        in_workers: units (and a restore's fingerprint check) run in worker processes.
        verify_on_restore: a restore re-reads the state's last step and refuses a change.
        audit_log: a path (``{shard}``: the shard index) for one JSON line per step, or None.
        foreign: how it reads states other than its own (Grain's, a stream's).
    """

    plan: Plan
    make_executor: ExecutorMaker
    filter_watch: Callable[[], FilterWatch | None]
    pipeline: Mapping[str, Any]
    in_workers: bool
    verify_on_restore: bool = True
    audit_log: str | None = None
    foreign: Foreign = dataclasses.field(default_factory=Foreign)


class DataLoaderIterator(DatasetIterator[Any]):
    """Iterates a :class:`~dataloader.DataLoader`; checkpointable at every step.

    ``get_state()`` describes the position after the last output handed out, whatever
    is still being computed or buffered; ``set_state(state)`` continues with the very
    next output in O(1) time, with any worker count. It is the engine's end of an
    elastic restore (an :class:`~dataloader.engine.restore.protocol.ElasticHead`).

    Args:
        engine: the loader's :class:`LoaderEngine`, or (Grain's signature) the ``DataLoader``.
        state: what :meth:`set_state` takes, to start from; None: the beginning.
    """

    stats_name: str | None = None  # stats(): the engine's stages are in its Stats
    # close() may come from any thread while a next() waits: the executor's close ends
    # that wait at once (Executor's contract), so the device feed closes it first.
    closes_from_any_thread = True
    _resume: Cursor | None = None  # after a PipelineError of an element stream: the restart
    _primed: list[Any] | None = None  # a fingerprint check's units from the cursor on

    def __init__(self, engine: LoaderEngine | Any, state: Any = None) -> None:
        super().__init__()
        if not isinstance(engine, LoaderEngine):
            from dataloader.loader import DataLoader

            if not isinstance(engine, DataLoader):
                raise TypeError(f"DataLoaderIterator needs a DataLoader (or its .engine), got "
                                f"{type(engine).__name__}: {engine!r}; iterate the loader (iter(loader)) instead")
            engine = engine.engine
        self._engine = self._home = engine  # home: the plain sharding, before any elastic restore
        self._plan = engine.plan
        self._executor: Any = None
        self._assembler: Any = None
        self._closed = False
        self._stats = Stats()
        self.stats_batches = self._plan.batch is not None
        # Steps handed out since the stream's start (None: unknown, after a restore from
        # a state without a fingerprint), and the fingerprint a restore brought.
        self._step: int | None = 0
        self._restored: dict[str, Any] | None = None
        self._log = None if engine.audit_log is None else fingerprint.AuditLog(engine.audit_log)
        if state is None:
            self._restart(Cursor(0))
        elif isinstance(state, (list, tuple)):
            restore_every_host(self, state)
        else:  # Grain's states are read against this iterator's state at the beginning
            saved = read_state(engine, state, lambda: make_state(self._plan, Cursor(0)))
            self._apply(resume(engine, engine, None, saved))

    @property
    def sampler(self) -> Any:
        """The sampler it reads now (after an elastic restore, its layout's share)."""
        return self._plan.sampler

    def last_tag(self) -> Any:
        """The ``(position, sub)`` of the element handed out last (None: a batch, or none)."""
        return self._assembler.last_tag()

    def prepare_hosts(self, hosts: Any) -> Callable[[], None]:
        """An elastic restore's checks and layout (``ElasticHead``); moves on the call."""
        return functools.partial(self._apply, resume(self._home, self._engine, None, hosts))

    def _apply(self, r: Resumed) -> None:
        if self._executor is not None and self._executor is not r.executor:
            self._executor.close()
        self._engine, self._plan = r.engine, r.engine.plan
        self._executor, self._primed = r.executor, r.primed
        self._restored, self._step = r.fingerprint, r.step
        self._restart(r.cursor)
        self._resume, self._closed = None, False

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
        resume_at, self._resume = self._resume, None
        if resume_at is not None:
            self._restart(resume_at)
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
        if self._log is not None:
            self._log.write(self._plan, self.get_state(), self._step)
        return out

    def _fingerprint(self) -> dict[str, Any] | None:
        """The last step's fingerprint (the restored one until a step is handed out)."""
        last = self._assembler.last_step()
        if last is None:
            return self._restored
        units, segments, output_index = last
        return fingerprint.of_step(self._plan, units, segments, self._step, output_index)

    def get_state(self) -> dict[str, Any]:
        """The position after the last output handed out, and its records' fingerprint."""
        state = make_state(self._plan, self._assembler.state())
        fp = self._fingerprint()
        if fp is not None:
            state[fingerprint.KEY] = fp
        return state

    def set_state(self, state: Any) -> None:
        """Continues from ``state`` (a dict from ``get_state``, or its JSON text).

        Given every old host's states (a list, of one step, on another host count) it
        reads this host's share of what they left unread, each record once
        (:mod:`dataloader.engine.restore.every_host`). A state of Grain's iterators is
        converted where granary continues it exactly (:mod:`dataloader.engine.restore.grain`).

        Raises:
            StateMismatchError: made for another data set, seed, sharding or pipeline
                (each difference named), or its fingerprint does not match what its last
                step reads now (unless ``verify_on_restore=False``). Nothing moves then.
        """
        saved = read_state(self._engine, state, self.get_state)
        before, restored = self._assembler.state(), self._restored
        try:
            resumed = resume(self._home, self._engine, self._executor, saved)
        except BaseException:
            self._restart(before)  # the check may have moved the executor
            self._restored = restored
            raise
        self._apply(resumed)

    def _get_next_index(self) -> int:
        per = self._plan.positions_per_output
        if per is None:
            return super()._get_next_index()
        return -(-self._assembler.state().position // per)

    def _set_next_index(self, index: int) -> None:
        per = self._plan.positions_per_output
        if per is None:
            return super()._set_next_index(index)
        self.set_state(make_state(self._plan, Cursor(int(index) * per)))

    def start_prefetch(self) -> None:
        """Starts computing units now (in-process read-ahead; workers start at once anyway)."""
        if isinstance(self._executor, Prefetching):
            self._executor.start_prefetch()

    def stats_totals(self) -> dict[str, Any]:
        return collect.engine_totals(self, self._stats, bool(self.stats_batches))

    def stats_pipeline(self) -> dict[str, Any]:
        return collect.engine_pipeline(self._engine.pipeline, self._stats, self._executor)

    @property
    def unit_stats(self) -> Stats:
        """The engine's per-unit counters and log (the report's timeline)."""
        return self._stats

    def close(self) -> None:
        """Stops all background work; safe to call more than once."""
        self._closed = True
        if self._executor is not None:
            self._executor.close()
        if self._log is not None:
            self._log.close()


def elastic_iterator(loader: Any, states: Any) -> DatasetIterator:
    """``loader.iterator(states)``: this host (``loader`` built with the new
    ``ShardOptions(j, H')``, any batch size or worker count) reads what the old hosts
    left unread, each record once. ``states``: every old host's ``get_state()`` of one
    step (any order; e.g. every process's file of an Orbax checkpoint), or one state an
    elastic restore made (its layout goes on, :mod:`dataloader.engine.restore.layout`)."""
    return loader.iterator(states)
