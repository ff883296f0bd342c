"""The worker-set protocol: what the one scheduling loop asks of any kind of worker.

The loop (:mod:`~dataloader.engine.pool.executor`) decides which unit goes where, keeps
the order, retries lost units and times stuck ones; it knows nothing of how a unit
reaches a worker or how its result comes back. That is the worker set's: child
processes (:class:`~dataloader.engine.pool.process_set.ProcessSet`: a pickled task, the
result in shared memory), threads of this process
(:class:`~dataloader.engine.pool.thread_set.ThreadSet`: the task and the result handed
over as objects), Ray actors (:class:`~dataloader.engine.remote.ray_actors.RayActors`:
an ``ObjectRef`` per unit), or a fake in the loop's tests. The output never depends on which.

Obligations of an implementation:

* workers are told apart by ``key`` (unique for the set's life) and own a slot
  ``index`` (kept by a replacement); the loop reads ``ready`` and ``retiring``;
* :meth:`Workers.send` hands a unit to a ready worker and returns a token (what was
  lent for its result), raising ``OSError`` when the worker is dying; a worker computes
  its units in the order sent and answers each once, through :meth:`Workers.events`
  (``Ready`` once started, ``Fatal`` if it cannot start, then ``Done``/``Failed``; None
  for a worker that died);
* the ``board`` says, per slot, which unit the worker *started* and when (units are
  timed from their start, never from when they were sent: a consumer that pauses while
  the window is full does not make a unit look stuck);
* :meth:`Workers.kill` stops a stuck worker, or abandons it where it cannot be stopped
  (``stop_words`` says which, for the error message);
* everything it holds is released by :meth:`Workers.close`, from any thread.

:class:`Slots` is the bookkeeping both real sets share: which slots are taken, started,
deferred, retiring or retired.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from dataloader.engine.compute import UnitResult
from dataloader.errors import LoaderClosedError

MAX_CRASHES = 3  # deaths of a unit's worker, or of starting workers, that make an error


class Closing(LoaderClosedError):
    """A worker was to start after ``close()`` was called (the loop rewords it, naming
    the unit its consumer waited for)."""


class Worker(Protocol):
    """One worker as the loop sees it."""

    index: int
    key: int
    ready: bool
    retiring: bool

    @property
    def where(self) -> str:
        """Where it runs, for messages (``"pid 123"``, ``"thread granary-worker-0"``)."""


class Footprint(Protocol):
    """What a worker set costs in memory, for ``worker_count="auto"``."""

    def footprint(self) -> tuple[int, int, int, int | None]:
        """``(cost, growth, block_size, block_room)``: the private bytes one more worker
        will cost, what the live ones will still grow by, the size of one result block
        (0: none) and the memory left for blocks (None: not bounded)."""


class Workers(Footprint, Protocol):
    """What the scheduling loop asks of its workers (see the module docstring)."""

    kind: str  # "processes", "threads" or "ray_actors", as stats() and messages say it
    stop_words: str  # what happens to a worker stopped for a stuck unit (the error)
    stop_verb: str  # the same, as the log says it ("killing it")
    # a unit past unit_timeout_s is computed again by another worker (up to MAX_CRASHES
    # times: Ray actors, which may run elsewhere), else it is the unit's error at once
    retries_stuck: bool
    workers: list[Any]  # every worker that takes units or is retiring
    deferred: list[int]  # slots still to start
    stopping: bool  # close() was called: start no worker
    # f(slots): the worker set to hand the stream over to (worker_kind="auto" measured
    # that processes fit); None: keep this one
    handover: Any

    @property
    def board(self) -> Any:
        """``.read(index) -> progress.Position``; None: no stall checks."""

    def describe(self) -> dict[str, Any]:
        """``stats()["pipeline"]["workers"]``: the kind, and how it was chosen."""

    def start(self, count: int, spare_a_core: bool) -> Iterator[Any]: ...
    def start_deferred(self) -> Iterator[Any]: ...
    def add(self, count: int) -> Iterator[Any]: ...
    def send(self, w: Any, generation: int, unit: int, start: int, stop: int, blocks_needed: int) -> Any: ...
    def give_back(self, token: Any) -> None: ...
    def events(self, timeout: float) -> Iterator[tuple[Any, Any, int]]: ...
    def result(self, w: Any, token: Any, message: Any, nbytes: int, blocks_needed: int) -> UnitResult: ...
    def error(self, w: Any, payload: Any) -> Exception: ...
    def note_local_result(self, result: UnitResult, blocks_needed: int) -> None: ...
    def wait_readable(self, timeout: float) -> None: ...
    def kill(self, w: Any) -> None: ...
    def bury(self, w: Any, timed_out: bool) -> int: ...
    def replace(self, w: Any) -> Iterator[Any]: ...
    def retire(self, count: int) -> list[Any]: ...
    def stop(self, w: Any) -> None: ...
    def reap_retired(self) -> None: ...
    def live(self) -> list[Any]: ...
    def worker_bytes(self) -> int: ...
    def close(self) -> None: ...


class Slots:
    """Slot bookkeeping shared by the worker sets: a subclass provides ``_spawn(index)``
    (a started worker in that slot) and ``_forget(w)`` (stop listening to it).

    Args:
        slots: the most workers there may be (their indices).
    """

    retries_stuck = False  # workers of one machine: a unit that hung once would hang again

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.workers: list[Any] = []  # in slot order at start; retiring ones too
        self.retired: list[Any] = []  # stopped by the autoscaler, not yet reaped
        self.deferred: list[int] = []  # slots to start once a worker is ready
        self.stopping = False  # set by close() from any thread: nothing starts after it

    def _spawn(self, index: int) -> Any:
        raise NotImplementedError

    def _forget(self, w: Any) -> None:
        raise NotImplementedError

    def _first(self, count: int, spare_a_core: bool) -> int:
        """How many of ``count`` workers start at once (the rest are deferred)."""
        return count

    def start(self, count: int, spare_a_core: bool) -> Iterator[Any]:
        """Starts workers ``0 .. count-1`` (some deferred, see ``_first``), yielding
        each as it starts."""
        now = self._first(count, spare_a_core)
        self.deferred = list(range(now, count))
        for index in range(now):
            yield self._join(self._spawn(index))

    def start_deferred(self) -> Iterator[Any]:
        """Starts the deferred workers (none once ``close()`` was called)."""
        while self.deferred and not self.stopping:
            yield self._join(self._spawn(self.deferred.pop(0)))

    def add(self, count: int) -> Iterator[Any]:
        """Starts ``count`` more workers in the free slots, lowest first."""
        used = {w.index for w in self.workers}
        free = [i for i in range(self.slots) if i not in used]
        for index in free[:count]:
            yield self._join(self._spawn(index))

    def _join(self, worker: Any) -> Any:
        self.workers.append(worker)
        return worker

    def replace(self, w: Any) -> Iterator[Any]:
        """Starts a buried worker's successor in its slot, yielding it (none if it was
        retiring: it leaves the set)."""
        i = self.workers.index(w)
        if w.retiring:
            del self.workers[i]
            return
        self.workers[i] = self._spawn(w.index)
        yield self.workers[i]

    def retire(self, count: int) -> list[Any]:
        """Marks ``count`` live workers (the highest indices) as retiring: they get no
        more units, and are stopped (``stop``) once they hold none."""
        chosen = sorted(self.live(), key=lambda w: -w.index)[:count]
        for w in chosen:
            w.retiring = True
        return chosen

    def live(self) -> list[Any]:
        """The workers that take units (not retiring)."""
        return [w for w in self.workers if not w.retiring]
