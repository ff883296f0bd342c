"""Units whose inputs the parent ships: element-wise work after a stage that only iterates.

A stage that has no random-access form (a packer, a window shuffle, a mix at the
iterator level, a user's ``IterDataset``, a gzip TFRecord stream) can only be iterated,
in order, in the training process. The element-wise operations chained after it still
run on the worker pool: the parent iterates the stage (cheap), cuts its elements into
units of ``unit_size`` consecutive elements (a size that does not depend on the worker
count), and ships each unit's elements to the worker that computes it. So position
``p`` of such a stream is its ``p``-th element, and a unit is computed by the very
function that computes every unit (:func:`~dataloader.engine.compute.compute_unit`):
the output, the random generators (keyed by ``p``), the errors and the crash recovery
are those of any other unit.

How the elements travel: the parent pickles a unit's elements once (protocol 5, numpy
payloads out of band) into a ``memfd`` of its own, and notes ``(start, count, fd)`` in a
small shared table (:class:`ShippedInputs`). A worker asked for positions ``[start,
stop)`` looks the unit up in the table and maps the parent's ``memfd`` through
``/proc/<parent>/fd/<fd>``, copy on write (so user code may write into the arrays it
receives). Nothing has a name: when the parent ends, however it ends, the kernel frees
the memory. The parent keeps a unit's elements until the consumer has taken its result,
so a unit lost with a killed worker is sent again over the same elements.

In the training process (``worker_count=0``) the same table hands out the elements
themselves, without pickling.

:class:`ShippedElementwiseIterator` is the stage built on it: the element-wise
operations after an iterated stage, computed unit by unit by a pool (or in process),
with the output and state keys of the element-by-element stage
(:mod:`dataloader.dataset.transformations.pooled` says how its states read).
"""

from __future__ import annotations

import mmap
import os
import pickle
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn

import numpy as np

from dataloader.engine.executor import InProcessExecutor
from dataloader.engine.plan import ELEMENTS, Plan, Step
from dataloader.engine.pool.shm import new_memfd
from dataloader.engine.restore.protocol import ElasticDefaults, StatePart, tag_reader
from dataloader.engine.sizing import Units
from dataloader.engine.stages.base import DatasetIterator, expect_state
from dataloader.engine.stages.elementwise import element_part
from dataloader.errors import PipelineError
from dataloader.operations import Operation
from dataloader.operations.transforms import MANY, resolve_seed
from dataloader.options import (
    DEFAULT_STALL_WARNING_S,
    MultiprocessingOptions,
    ReadOptions,
    check_worker_count,
)
from dataloader.samplers.view import ElementOrder

# Elements of the iterated stage per unit: a fixed grid, whatever the worker count.
UNIT_SIZE = 64

# Units alive at once (in flight, buffered, being handed out) stay far below this; the
# table is keyed by unit number modulo it.
_SLOTS = 4096
_ALIGN = 64
_HEAD = 16  # two int64: number of buffers, length of the pickle header


def _round_up(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def write_elements(elements: list[Any]) -> tuple[int, int]:
    """Pickles ``elements`` into a new ``memfd``; returns its descriptor and size.

    Layout: the number of out-of-band buffers and the header's length (two int64), one
    ``(offset, length)`` pair per buffer, the pickle header, then each buffer, aligned.
    """
    buffers: list[pickle.PickleBuffer] = []
    header = pickle.dumps(elements, protocol=5, buffer_callback=buffers.append)
    raws = [b.raw() for b in buffers]
    table = np.empty((len(raws), 2), dtype=np.int64)
    offset = _round_up(_HEAD + table.nbytes + len(header))
    for i, raw in enumerate(raws):
        table[i] = offset, raw.nbytes
        offset = _round_up(offset + raw.nbytes)
    size = max(offset, _ALIGN)
    fd = new_memfd("granary-inputs")
    try:
        os.ftruncate(fd, size)
        with mmap.mmap(fd, size) as target:
            target[0:_HEAD] = np.asarray([len(raws), len(header)], dtype=np.int64).tobytes()
            at = _HEAD + table.nbytes
            target[_HEAD:at] = table.tobytes()
            target[at : at + len(header)] = header
            for (start, n), raw in zip(table.tolist(), raws):
                target[start : start + n] = raw.cast("B")
    except BaseException:
        os.close(fd)
        raise
    return fd, size


def read_elements(path: str) -> list[Any]:
    """The elements :func:`write_elements` wrote, mapped copy on write from ``path``."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        mapped = mmap.mmap(fd, size, access=mmap.ACCESS_COPY)
    finally:
        os.close(fd)
    base = np.frombuffer(mapped, dtype=np.uint8)
    count, header_len = np.frombuffer(base[:_HEAD], dtype=np.int64).tolist()
    at = _HEAD + 16 * count
    table = np.frombuffer(base[_HEAD:at], dtype=np.int64).reshape(count, 2).tolist()
    header = base[at : at + header_len].tobytes()
    # The arrays view the mapping, which stays alive while one of them does.
    return pickle.loads(header, buffers=[base[o : o + n] for o, n in table])


class ShippedInputs:
    """The data source of a shipped stream: the elements of the units alive.

    In the parent, :meth:`put` adds a unit's elements (and ships them when
    ``shared``), :meth:`drop` frees them. Pickled (for the workers) it keeps only the
    parent's pid and the table's descriptor: a worker reads each unit from the parent's
    shared memory.

    Args:
        unit_size: the grid of units (no unit crosses a multiple of it).
        shared: ship units to other processes (worker pool), not only keep them here.
    """

    def __init__(self, unit_size: int, shared: bool) -> None:
        self.unit_size = unit_size
        self._local: dict[int, tuple[int, list[Any], int]] = {}  # key -> (start, elements, fd)
        self._pid = os.getpid()
        self._table_fd = -1
        self._table: np.ndarray | None = None
        self._mapped: Any = None
        if shared:
            self._table_fd = new_memfd("granary-input-table")
            os.ftruncate(self._table_fd, _SLOTS * 3 * 8)
            self._mapped = mmap.mmap(self._table_fd, _SLOTS * 3 * 8)
            self._table = np.frombuffer(self._mapped, dtype=np.int64).reshape(_SLOTS, 3)
            self._table[:] = -1

    def __getstate__(self) -> dict[str, Any]:
        if self._table_fd < 0:
            raise TypeError("a ShippedInputs made with shared=False stays in its process")
        return {"unit_size": self.unit_size, "pid": self._pid, "table_fd": self._table_fd}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.unit_size = state["unit_size"]
        self._pid, self._table_fd = state["pid"], state["table_fd"]
        self._local, self._table, self._mapped = {}, None, None

    # -- the parent --------------------------------------------------------------------

    def put(self, start: int, elements: list[Any]) -> None:
        key = start // self.unit_size
        if key in self._local:
            raise AssertionError(f"unit at {start} is already stored")
        fd = -1
        if self._table is not None:
            slot = key % _SLOTS
            if self._table[slot, 0] >= 0 and self._table[slot, 0] // self.unit_size in self._local:
                raise RuntimeError(f"more than {_SLOTS} units of shipped elements alive at once")
            fd, _ = write_elements(elements)
            self._table[slot] = start, len(elements), fd
        self._local[key] = (start, elements, fd)

    def drop(self, start: int) -> None:
        entry = self._local.pop(start // self.unit_size, None)
        if entry is not None and entry[2] >= 0:
            os.close(entry[2])

    def drop_all(self) -> None:
        for _, _, fd in self._local.values():
            if fd >= 0:
                os.close(fd)
        self._local.clear()

    def close(self) -> None:
        self.drop_all()
        if self._table_fd >= 0 and self._mapped is not None:
            self._table = None
            self._mapped.close()
            os.close(self._table_fd)
            self._table_fd = -1

    # -- the data source -----------------------------------------------------------------

    def __len__(self) -> int:
        return 2**62  # an endless stream: the upstream ends it

    def __getitem__(self, position: int) -> Any:
        return self.__getitems__([position])[0]

    def __getitems__(self, positions: Any) -> list[Any]:
        positions = np.asarray(positions, dtype=np.int64)
        if positions.size == 0:
            return []
        first, last = int(positions[0]), int(positions[-1])
        key = first // self.unit_size
        entry = self._local.get(key)
        if entry is None and self._mapped is None and self._table_fd >= 0:
            entry = self._fetch(key, first)
        if entry is None:
            raise LookupError(f"the elements of position {first} are no longer held (a stale unit)")
        start, elements, _ = entry
        if not start <= first <= last < start + len(elements):
            raise LookupError(f"positions {first}..{last} are not in the unit at {start}")
        if positions.size != last - first + 1:
            return [elements[p - start] for p in positions.tolist()]
        return elements[first - start : last - start + 1]

    def _fetch(self, key: int, first: int) -> tuple[int, list[Any], int] | None:
        """A worker: the unit's elements, read from the parent's shared memory."""
        if self._table is None:
            path = f"/proc/{self._pid}/fd/{self._table_fd}"
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError as exc:
                raise OSError(
                    f"a worker cannot open the training process's shared memory at {path} "
                    f"({exc}); the elements after an iterated stage reach the workers through "
                    f"/proc, which this system hides; use mp_prefetch(num_workers=0) for them"
                ) from exc
            try:
                self._mapped_table = mmap.mmap(fd, _SLOTS * 3 * 8, prot=mmap.PROT_READ)
            finally:
                os.close(fd)
            self._table = np.frombuffer(self._mapped_table, dtype=np.int64).reshape(_SLOTS, 3)
        start, count, fd = self._table[key % _SLOTS].tolist()
        if start < 0 or start // self.unit_size != key:
            return None
        elements = read_elements(f"/proc/{self._pid}/fd/{fd}")
        if len(elements) != count:
            return None  # the slot was reused while it was read: a stale unit
        return start, elements, -1

    def __repr__(self) -> str:
        return f"ShippedInputs(unit_size={self.unit_size})"


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
                    befores.append(self.upstream.get_state())
                    elements.append(next(self.upstream))
                    tags.append(self._tag())
                after = self.upstream.get_state()
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


def _after(befores: list[Any], after: Any, start: int, failed: int) -> tuple[list[Any], int]:
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


class ShippedElementwiseIterator(DatasetIterator, ElasticDefaults):
    """``ops`` over ``parent``'s elements, unit by unit, on ``options.num_workers``
    worker processes (0: in this process, unit by unit all the same).

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
        self._inputs = ShippedInputs(unit_size, shared=count != 0)
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

            plan_bytes = pickle_plan(worker_plan)
            zygote.prestart(plan_bytes)
            self._executor = PoolExecutor(
                plan, plan_bytes, 0, worker_count=count,
                buffer_size=options.per_worker_buffer_size, init_fn=init_fn,
                stall_warning_s=DEFAULT_STALL_WARNING_S,  # as a DataLoader's pool
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
            self._error, self._go_on = result.error, _after(befores, after, start, result.stop)
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
        return _after(befores, after, start, failed)

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
