"""``DataLoader``: wires a data source, a sampler and operations into an iterable."""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

from dataloader.engine.executor import Described, ExecutorKind, ExecutorMaker
from dataloader.engine.in_process import InProcessExecutor
from dataloader.engine.plan import BATCH, Plan, make_plan
from dataloader.engine.pool import zygote as fork_server
from dataloader.engine.pool.executor import PoolExecutor
from dataloader.engine.pool.messages import pickle_plan
from dataloader.engine.stages.base import DatasetIterator
from dataloader.engine.stages.finite import EndTogether, resolve_end, static_steps, steps_over
from dataloader.engine.stages.tail import TailIterator, check_shippable, split_at_first_packer
from dataloader.engine.stats import FilterWatch
from dataloader.engine.stats.pipeline import describe_pipeline
from dataloader.iterator import DataLoaderIterator, LoaderEngine
from dataloader.operations.transforms import refuse_class
from dataloader.options import (
    DEFAULT_STALL_WARNING_S,
    AutoWorkers,
    DatasetOptions,
    ReadOptions,
    check_bool,
    check_int,
    check_seconds,
    check_worker_count,
    check_worker_kind,
    fingerprint_default,
)
from dataloader.samplers import Sampler, ShardOptions
from dataloader.samplers.protocol import missing_members

logger = logging.getLogger("dataloader")


def _resolve_sampler(sampler: Any, shard_options: ShardOptions | None) -> Sampler:
    """Applies the loader's shard options to the sampler, refusing a contradiction."""
    missing = missing_members(sampler)
    if missing:
        raise TypeError(
            f"sampler {sampler!r} is not a Sampler: it has no {', '.join(map(repr, missing))}; "
            f"pass a dl.IndexSampler (or SequentialSampler)"
        )
    if shard_options is None:
        return sampler
    if not isinstance(shard_options, ShardOptions):
        raise TypeError(f"shard_options must be a ShardOptions, got {shard_options!r}")
    own = sampler.shard_options
    if own == shard_options:  # ShardOptions compare by their fields
        return sampler
    if own.shard_count != 1:
        raise ValueError(
            f"the sampler is already sharded ({own}) and the loader was given "
            f"shard_options={shard_options}; pass the shard options in one place only"
        )
    return sampler.with_shard_options(shard_options)


class DataLoader:
    """Reads records by index, applies operations, and yields results in order.

    Args:
        data_source: random-access source (``__len__``, ``__getitem__`` and optionally
            ``__getitems__``), e.g. :class:`~sources.ArrayRecordDataSource`.
        sampler: an :class:`~samplers.IndexSampler`: order, epochs and sharding.
        operations: ``MapTransform``, ``RandomMapTransform``, ``FilterTransform``,
            ``FlatMapTransform``, at most one ``Batch``, and packers (``FirstFitPack``,
            ``BestFitPack``, ``ConcatThenSplit``), applied in order. The operations
            before the first packer run by position on the engine (in the workers); a
            packer and what follows it run in order on the engine's output, in this
            process (see :mod:`dataloader.engine.stages.tail`).
        worker_count: child processes computing work units (0: in this process), or
            ``"auto"`` (or an :class:`~dataloader.AutoWorkers` to tune it): the pool
            picks the count and changes it as it runs, from how long the consumer
            waits and how many workers sit idle, within the memory of the machine and
            the container. The output is the same for every worker count, changing or not.
        worker_buffer_size: work units in flight per worker.
        worker_kind: what the workers are: ``"processes"`` (child processes, the
            default), ``"threads"`` (threads of this process: no pickling, no copy, no
            interpreter per worker; for work that releases the GIL), or ``"auto"``
            (threads, handed over to processes when a short trial on the first units
            measures that they hold the GIL; threads on a free-threaded interpreter).
            None: the ``GRANARY_WORKER_KIND`` environment variable, else processes.
            The output and the states are the same for every kind (see
            :mod:`dataloader.engine.pool.thread_set` for what threads change).
        shard_options: sharding, if the sampler does not carry it already (giving
            different non-trivial options in both places is an error).
        read_options: read-ahead of the in-process path; see :class:`ReadOptions`.
        worker_init_fn: ``f(worker_index, worker_count)`` run once in each child.
        warm_start: an opt-in that runs user code in the training process: with
            workers, compute the units asked for in this process until a worker is
            ready. False (the default): every unit runs in a worker, so a record that
            crashes its process (a segfaulting decoder, ``os._exit``) is survived,
            ``worker_init_fn`` applies to every unit and a result that does not pickle
            is named. Building the loader starts the process's fork server in the
            background (:mod:`dataloader.engine.pool.zygote`), kept for every later
            loader and ``iter()``, so workers fork in milliseconds; only an ``iter()``
            right after the first loader is built waits for the server's start (a few
            tenths of a second).
        options: Grain's ``DatasetOptions``: a warning (default at 90%) or an error when
            filters drop more than a share of the records read.
        stall_warning_s: with workers, log a warning (logger ``"dataloader"``, once per
            unit) naming the worker, the unit, its record indices and the operation,
            when a worker has been computing one unit for this many seconds. None: never.
        unit_timeout_s: with workers, a unit computed for this many seconds becomes a
            :class:`~dataloader.WorkerTimeoutError` at its place in the stream; its
            worker is killed and replaced, and the unit is not computed again. Every
            unit then runs in a worker (no warm start: a unit computed in this process
            cannot be stopped). None (the default): never. Needs ``worker_count > 0``.
        fingerprint: every state carries a fingerprint of its last step's records
            (their keys, a digest of their bytes and of the operations' output),
            computed by whoever computes the unit (:mod:`dataloader.engine.fingerprint`).
            It costs hashing each record and output (5-33 us a row, measured). False:
            states carry none, and a restore checks none (unless ``verify_on_restore``
            says so). None (the default): ``options.fingerprint`` if set, else
            ``$GRANARY_FINGERPRINT`` (``0``: off), else on.
        verify_on_restore: a restore from a state with a fingerprint re-reads that
            step's records and refuses the state, naming what differs, when the data
            or the operations changed; False restores without the check. None (the
            default): as ``fingerprint``.
        audit_log: append a JSON line per step (state and fingerprint) to this path;
            ``{shard}`` in it becomes the shard index (needed when sharded). Compare
            two logs with ``python -m dataloader audit LOG_A LOG_B``.
        end: None (the default): each host stops where its data stops. ``"pad"`` (or a
            :class:`~dataloader.PadEnd`): with finite data every host runs the same
            number of steps, the last batches padded and masked where a host runs out
            (:mod:`dataloader.engine.stages.finite`); needs a ``Batch`` of dicts.
        executor: computes the units somewhere other than this process or its children,
            e.g. :class:`~dataloader.RayExecutor` (Ray actors on a cluster); the output
            and the states are the same. With it, ``worker_count`` stays 0.

    User code's exceptions, whatever their type (``SystemExit`` and other
    ``BaseException`` subclasses too), arrive as :class:`~dataloader.PipelineError` at
    their record, in workers and in this process alike, except a ``KeyboardInterrupt``
    in this process (``worker_count=0``), which passes through so that Ctrl-C still
    interrupts the job.

    The settings are read once, here: the loader's iterators run :attr:`engine`, a
    frozen value made from them, so changing an attribute afterwards changes nothing.

    Example:
        >>> import dataloader as dl
        >>> loader = dl.DataLoader(
        ...     data_source=dl.RangeDataSource(10),
        ...     sampler=dl.IndexSampler(10, shuffle=True, seed=1, num_epochs=1),
        ...     operations=[dl.MapTransform(lambda x: x * 10), dl.Batch(4)])
        >>> [b.tolist() for b in loader][0]
        [40, 60, 20, 80]
    """

    def __init__(
        self,
        data_source: Any,
        sampler: Any,
        operations: Sequence[Any] = (),
        *,
        worker_count: int | str | AutoWorkers = 0,
        worker_buffer_size: int = 2,
        worker_kind: str | None = None,
        shard_options: ShardOptions | None = None,
        read_options: ReadOptions | None = None,
        worker_init_fn: Callable[[int, int], Any] | None = None,
        warm_start: bool = False,
        options: DatasetOptions | None = None,
        stall_warning_s: float | None = DEFAULT_STALL_WARNING_S,
        fingerprint: bool | None = None,
        verify_on_restore: bool | None = None,
        audit_log: str | None = None,
        unit_timeout_s: float | None = None,
        executor: Any = None,
        end: Any = None,
    ) -> None:
        if not (hasattr(data_source, "__len__") and hasattr(data_source, "__getitem__")):
            raise TypeError(
                f"data_source {data_source!r} needs __len__ and __getitem__ (a random-access "
                f"source such as ArrayRecordDataSource or InMemoryDataSource)"
            )
        sampler = _resolve_sampler(sampler, shard_options)
        if sampler.num_records > len(data_source):
            raise ValueError(
                f"the sampler has num_records={sampler.num_records} but the data source "
                f"{data_source!r} holds only {len(data_source)} records; build the sampler "
                f"with num_records=len(source)"
            )
        if not isinstance(operations, (list, tuple)):
            raise TypeError(
                f"operations must be a list of operations, got {operations!r} of type "
                f"{type(operations).__name__}; pass a list, e.g. operations=[dl.MapTransform(f), "
                f"dl.Batch(32)] (or [] for none)"
            )
        for i, op in enumerate(operations):
            refuse_class(op, f"operations[{i}]")
        read_options = read_options or ReadOptions()
        if not isinstance(read_options, ReadOptions):
            raise TypeError(f"read_options must be a ReadOptions, got {read_options!r}")
        if worker_init_fn is not None and not callable(worker_init_fn):
            raise TypeError(f"worker_init_fn must be callable, got {worker_init_fn!r}")
        self.worker_count = check_worker_count("worker_count", worker_count)
        self.worker_kind = check_worker_kind("worker_kind", worker_kind)
        if executor is not None and not isinstance(executor, ExecutorKind):
            raise TypeError(
                f"executor must have make_executor(plan, plan_bytes, position, init_fn), such as "
                f"dl.RayExecutor(...), got {executor!r}"
            )
        if executor is not None and self.worker_count:
            raise ValueError(
                f"executor={executor!r} computes the units, and worker_count="
                f"{self.worker_count!r} asks for local workers too; pass worker_count=0 "
                f"with an executor"
            )
        # The one test of it: the engine value carries it on.
        in_workers = bool(self.worker_count) or executor is not None
        self.worker_buffer_size = check_int("worker_buffer_size", worker_buffer_size, 1)
        self.read_options = read_options
        self.worker_init_fn = worker_init_fn
        self.warm_start = check_bool("warm_start", warm_start)
        if options is not None and not isinstance(options, DatasetOptions):
            raise TypeError(f"options must be a DatasetOptions, got {options!r}")
        self.options = options or DatasetOptions()
        self.stall_warning_s = check_seconds("stall_warning_s", stall_warning_s)
        self.unit_timeout_s = check_seconds("unit_timeout_s", unit_timeout_s)
        if self.unit_timeout_s is not None and not self.worker_count:
            raise ValueError(
                f"unit_timeout_s={unit_timeout_s!r} needs worker_count > 0: a unit computed "
                f"in this process cannot be stopped; use worker processes or drop "
                f"unit_timeout_s"
            )
        head, self._tail = split_at_first_packer(operations)
        self.plan: Plan = make_plan(data_source, sampler, head, read_options.unit_size)
        if fingerprint is None:
            fingerprint = self.options.get("fingerprint")
        fingerprint = fingerprint_default() if fingerprint is None else check_bool("fingerprint", fingerprint)
        self.plan = dataclasses.replace(self.plan, fingerprint=fingerprint)
        verify_on_restore = fingerprint if verify_on_restore is None else verify_on_restore
        audit_log = _check_audit_log(self.options.get("audit_log") if audit_log is None else audit_log, sampler)
        if self._tail:
            _check_stage_operations(self._tail)
            if self.worker_count:
                check_shippable(self._tail)  # the maps after the packer go to the workers
        self.end = resolve_end(end)
        if self.end is not None:
            self._end_batch = _end_batch(operations)
        make_executor: ExecutorMaker
        self._plan_bytes: bytes
        if executor is not None:
            self._plan_bytes = pickle_plan(self.plan)  # as for local workers: fails here
            make_executor = ExecutorMaker(
                executor.make_executor, self.plan, self._plan_bytes, {"init_fn": self.worker_init_fn}
            )
        elif in_workers:
            self._plan_bytes = self._pickled_for_processes()
            make_executor = ExecutorMaker(PoolExecutor, self.plan, self._plan_bytes, {
                "worker_count": self.worker_count,
                "buffer_size": self.worker_buffer_size,
                "init_fn": self.worker_init_fn,
                "worker_kind": self.worker_kind,
                "warm_start": self.warm_start,
                "stall_warning_s": self.stall_warning_s,
                "unit_timeout_s": self.unit_timeout_s,
            })
        else:
            self._plan_bytes = b""
            make_executor = ExecutorMaker(InProcessExecutor, self.plan, None, {"read_options": read_options})
        # Values only (no bound method of the loader): the iterators never reach back.
        self._engine = LoaderEngine(
            plan=self.plan,
            make_executor=make_executor,
            filter_watch=functools.partial(
                FilterWatch.for_operations, [s.op for s in self.plan.pre], self.options
            ),
            pipeline=describe_pipeline(
                self.plan, worker_count=self.worker_count,
                worker_buffer_size=self.worker_buffer_size, read_options=read_options,
                executor=None if executor is None else executor.describe()
                if isinstance(executor, Described) else {"kind": type(executor).__name__},
            ),
            in_workers=in_workers,
            verify_on_restore=check_bool("verify_on_restore", verify_on_restore),
            audit_log=audit_log,
        )

    def _pickled_for_processes(self) -> bytes:
        """The plan pickled for worker processes (b"" for threads, which share it).

        Pickled once, here, so an operation that cannot reach the workers fails now; with
        ``worker_kind="auto"`` such a plan runs on threads. The fork server starts now,
        in the background, and imports what the plan needs: iter() then only forks."""
        if self.worker_kind == "threads":
            return b""
        try:
            plan_bytes = pickle_plan(self.plan)
        except TypeError as exc:
            if self.worker_kind != "auto":
                raise
            logger.info("granary: worker_kind auto: threads, the pipeline cannot be pickled (%s)", exc)
            self.worker_kind = "threads"
            return b""
        fork_server.prestart(plan_bytes)
        return plan_bytes

    @property
    def engine(self) -> LoaderEngine:
        """The frozen value the loader's iterators run (plan, executor factory, filter
        thresholds, the pipeline's description)."""
        return self._engine

    @property
    def data_source(self) -> Any:
        return self.plan.source

    @property
    def sampler(self) -> Any:
        return self.plan.sampler

    @property
    def operation_names(self) -> list[str]:
        """Every operation's name, the engine's and the stages' after a packer."""
        return [*self.plan.operation_names, *(op.name for op in self._tail)]

    @property
    def stage_operations(self) -> list[Any]:
        """The operations from the first packer on, run as stages after the engine's
        stream (:class:`~dataloader.engine.stages.tail.TailIterator`); empty: none."""
        return list(self._tail)

    def __iter__(self) -> DatasetIterator:
        return self.iterator()

    def iterator(self, state: Any = None) -> DatasetIterator:
        """A new iterator, starting from ``state`` (from ``get_state``) when given.

        It is a :class:`DataLoaderIterator`, or with a packer among the operations a
        :class:`~dataloader.engine.stages.tail.TailIterator` over one.
        """
        if self.end is not None:
            return self._end_together(state)
        if not self._tail:
            return DataLoaderIterator(self._engine, state)
        it = self._tail_iterator()
        if state is not None:
            it.set_state(state)
        return it

    def _tail_iterator(self) -> TailIterator:
        """The stages from the first packer on over the engine; with workers, the
        element-wise operations among them run on a pool too (not the packers)."""
        return TailIterator(
            DataLoaderIterator(self._engine), self._tail, self.plan.sampler.seed,
            workers=self.worker_count, init_fn=self.worker_init_fn, worker_kind=self.worker_kind,
        )

    def _end_together(self, state: Any) -> EndTogether:
        """``end="pad"``: the step count computed for a plain batch, else agreed by the
        hosts (through JAX's runtime, imported only then)."""
        assert self.end is not None
        batch_size, drop_remainder = self._end_batch
        plan, sampler = self.plan, self.plan.sampler
        plain = not self._tail and plan.layout == BATCH and not any(s.op.reshapes for s in plan.post)
        steps = static_steps(sampler, batch_size, drop_remainder) if plain else None
        exchange = None
        if steps is None and sampler.num_positions is not None and sampler.shard_options.shard_count > 1:
            if self.end.exchange is not None:
                exchange = self.end.exchange()
            else:
                from dataloader.device.ends import KeyValueExchange

                exchange = KeyValueExchange()
        recount = None
        parent: DatasetIterator
        if steps is not None:  # a plain batch: the head itself, whose sampler a restore may move
            head = parent = DataLoaderIterator(self._engine)
            recount = functools.partial(_steps_of, head, batch_size, drop_remainder)
        else:
            parent = DataLoaderIterator(self._engine) if not self._tail else self._tail_iterator()
        it = EndTogether(parent, batch_size=batch_size, end=self.end, steps=steps, exchange=exchange, recount=recount)
        if state is not None:
            it.set_state(state)
        return it

    def __repr__(self) -> str:
        return (
            f"DataLoader(data_source={self.plan.source!r}, sampler={self.plan.sampler!r}, "
            f"operations={self.operation_names}, worker_count={self.worker_count})"
        )


def _steps_of(head: DataLoaderIterator, batch_size: int, drop_remainder: bool) -> tuple[int, int] | None:
    """``end="pad"``'s computed step count over what ``head`` reads now."""
    return steps_over(head.sampler, batch_size, drop_remainder)


def _end_batch(operations: Sequence[Any]) -> tuple[int, bool]:
    """``(batch_size, drop_remainder)`` of the last ``Batch``, which ``end="pad"`` fills."""
    from dataloader.operations import Batch

    batches = [op for op in operations if isinstance(op, Batch)]
    if not batches:
        raise ValueError(
            'end="pad" pads the last batches, and the operations have no Batch; add a '
            "dl.Batch(batch_size) (or leave end=None)"
        )
    return batches[-1].batch_size, batches[-1].drop_remainder


def _check_audit_log(path: Any, sampler: Sampler) -> str | None:
    """``audit_log`` as a path string; each shard needs a log of its own."""
    if path is None:
        return None
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"audit_log must be a path (str or os.PathLike) or None, got {path!r}")
    path = os.fspath(path)
    if sampler.shard_options.shard_count > 1 and "{shard}" not in path:
        raise ValueError(
            f"audit_log={path!r} would be written by each of the "
            f"{sampler.shard_options.shard_count} shards; put {{shard}} in the path "
            f"(e.g. 'audit-{{shard}}.jsonl'), which becomes the shard index"
        )
    return path


def _check_stage_operations(tail: list[Any]) -> None:
    """The operations after a packer: any that declares where it runs (element-wise ones,
    batches and stream operations)."""
    from dataloader.operations.transforms import ELEMENT, GROUP, STREAM, runs_of

    for op in tail:
        if runs_of(op) not in (ELEMENT, GROUP, STREAM):
            raise TypeError(
                f"{op!r} after a packer is not an operation (a map, random map, filter, "
                f"flat map, batch or packer)"
            )


def load(
    source: Any,
    *,
    num_epochs: int | None = None,
    shuffle: bool = False,
    seed: int | None = None,
    shard_options: ShardOptions | None = None,
    transformations: Sequence[Any] = (),
    batch_size: int | None = None,
    drop_remainder: bool = False,
    worker_count: int | str | AutoWorkers | None = 0,
    read_options: ReadOptions | None = None,
) -> DataLoader:
    """Grain's ``grain.load``: a ``DataLoader`` for a simple pipeline in one call.

    An :class:`~dataloader.samplers.IndexSampler` over ``source`` (``num_epochs``,
    ``shuffle``, ``seed``, ``shard_options``), ``transformations`` in order, then a
    ``Batch(batch_size, drop_remainder)`` when ``batch_size`` is given. ``worker_count``
    None is 0, as in Grain.

    Example:
        >>> import dataloader as dl
        >>> [b.tolist() for b in dl.load(dl.RangeDataSource(0, 5, 1), num_epochs=1, batch_size=2)]
        [[0, 1], [2, 3], [4]]
    """
    from dataloader.operations import Batch
    from dataloader.samplers import IndexSampler, NoSharding

    sampler = IndexSampler(
        num_records=len(source), shard_options=shard_options or NoSharding(),
        shuffle=shuffle, num_epochs=num_epochs, seed=seed,
    )
    operations = list(transformations)
    if batch_size is not None:
        operations.append(Batch(batch_size, drop_remainder=drop_remainder))
    return DataLoader(source, sampler, operations, worker_count=worker_count or 0, read_options=read_options)
