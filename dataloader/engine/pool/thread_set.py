"""Worker threads: the :class:`~dataloader.engine.pool.workers.Workers` of this process's threads.

A unit reaches a thread as a tuple in its inbox and its result comes back as the very
object :func:`~dataloader.engine.compute.compute_unit` made: nothing is pickled, nothing
copied, no interpreter is started (a worker process costs about 50 MB). The units, the
window and the order are the scheduling loop's, as with processes, so the output and
the states are the same for both kinds and for ``worker_count=0``.

What threads change:

* ``worker_init_fn(worker_index, worker_count)`` runs once in each thread, before its
  first unit (module globals are shared by all threads: keep per-worker state in
  ``threading.local``);
* an exception in a unit is the object raised, at its record, with its own traceback;
* a thread cannot be killed: a unit past ``unit_timeout_s`` still becomes a
  :class:`~dataloader.WorkerTimeoutError` at its place, but its thread is abandoned (it
  runs until the user code returns, its result is dropped) and a new thread takes its
  slot; ``stall_warning_s`` names the thread as it names a process;
* a crash of the interpreter (a segfaulting decoder) takes the training process with it.

Every structure that threads share is guarded by a lock (the events, the board, each
inbox is a ``queue.Queue``), never by the GIL, so the set is correct on a free-threaded
interpreter too.
"""

from __future__ import annotations

import collections
import functools
import itertools
import os
import queue
import threading
import time
import traceback
from collections.abc import Iterator
from typing import Any

from dataloader.engine.compute import UnitResult, compute_unit, hint_unit
from dataloader.engine.plan import Plan
from dataloader.engine.pool.autoscale.kind import KindTrial, clocks
from dataloader.engine.pool.messages import Done, Failed, Fatal, Ready
from dataloader.engine.pool.watch.progress import IDLE, SENDING, Position
from dataloader.engine.pool.workers import Closing, Slots
from dataloader.errors import PipelineError, WorkerError

_KEYS = itertools.count()


class ThreadBoard:
    """Where each thread is (the processes' :class:`~.watch.progress.Board`, in memory)."""

    def __init__(self, slots: int) -> None:
        self._lock = threading.Lock()
        self._slots = [Position(-1, 0, 0, 0)] * slots
        self._owner = [-1] * slots  # the key of the thread that writes each slot

    def claim(self, index: int, key: int) -> None:
        with self._lock:
            self._owner[index] = key
            self._slots[index] = Position(-1, 0, 0, 0)

    def write(self, index: int, key: int, generation: int | None, unit: int | None, stage: int) -> None:
        """The thread ``key`` is in ``stage`` (of a new unit when ``unit`` is given); an
        abandoned thread no longer owns its slot and writes nothing."""
        with self._lock:
            if self._owner[index] != key:
                return
            old = self._slots[index]
            if unit is None or generation is None:
                self._slots[index] = old._replace(stage=stage)
            else:
                self._slots[index] = Position(generation, unit, stage, time.monotonic_ns())

    def read(self, index: int) -> Position:
        with self._lock:
            return self._slots[index]


def resident_bytes() -> int:
    """This process's resident memory (``/proc/self/statm``: one read, no walk of the
    mappings); 0 where the kernel does not say."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class ThreadWorker:
    """One worker thread: its slot, its inbox, and whether the set still listens to it."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.key = next(_KEYS)
        self.ready = False
        self.retiring = False
        self.gone = False  # buried, stopped or abandoned: its answers are dropped
        self.held = 0  # units sent and not answered (read by the consumer's thread only)
        self.inbox: queue.Queue[tuple[int, int, int, int] | None] = queue.Queue()
        self.thread: threading.Thread | None = None

    @property
    def pid(self) -> int:
        return os.getpid()

    @property
    def where(self) -> str:
        return f"thread granary-worker-{self.index} of this process"

    def leave(self) -> None:
        """Stops listening to it: queued units are dropped, it exits after the unit it
        computes (if any: user code cannot be interrupted)."""
        self.gone = True
        while True:
            try:
                self.inbox.get_nowait()
            except queue.Empty:
                break
        self.inbox.put(None)


class ThreadSet(Slots):
    """The worker threads of one pool (see the module docstring).

    Args:
        slots: the most threads there may be.
        plan: the pipeline's plan (the object itself: threads share it).
        init_fn: the user's ``worker_init_fn(worker_index, worker_count)``, or None.
        trial: ``worker_kind="auto"``'s measurement (:mod:`~.autoscale.kind`): one
            thread starts, the others once it has computed its units alone.
        then: ``f(slots)``, the processes to hand over to if the trial says so.
        why: how the kind was chosen, for ``stats()``.
    """

    kind = "threads"
    stop_words = (
        "a thread cannot be killed: it was abandoned (it runs on until its code returns, "
        "its result is dropped) and a new thread took its place"
    )
    stop_verb = "abandoning it (a thread cannot be killed) and starting another"

    def __init__(
        self,
        slots: int,
        plan: Plan,
        init_fn: Any = None,
        trial: KindTrial | None = None,
        then: Any = None,
        why: str = "asked for",
    ) -> None:
        super().__init__(slots)
        self._why = why
        self._plan, self._init_fn = plan, init_fn
        self.trial, self._then = trial, then
        self.board = ThreadBoard(slots)
        self._events: collections.deque[tuple[ThreadWorker, Any]] = collections.deque()
        self._cond = threading.Condition()

    # -- starting -------------------------------------------------------------------------

    def _first(self, count: int, spare_a_core: bool) -> int:
        return 1 if self.trial is not None else count

    def start_deferred(self) -> Iterator[ThreadWorker]:
        """The other threads start once the trial's first thread computed alone."""
        if self.trial is None or self.trial.solo_done:
            yield from super().start_deferred()

    @property
    def handover(self) -> Any:
        """``f(slots)`` of the processes the trial chose, or None (keep the threads)."""
        trial = self.trial
        if trial is None or trial.verdict != "processes":
            return None
        if trial.gil_share is None:  # too busy a machine to read it: processes
            why = trial.why
        else:
            why = f"measured on the first units: a unit holds the GIL about {trial.gil_share:.0%} of its time"
        return functools.partial(self._then, why=why)

    def describe(self) -> dict[str, Any]:
        """The kind and why, the number of worker threads, and the memory they have: the
        process's resident memory, once (threads share one address space, so no thread
        has a figure of its own; it is the training loop's too)."""
        out: dict[str, Any] = (
            self.trial.describe() if self.trial is not None else {"worker_kind": "threads", "why": self._why}
        )
        out["threads"] = len(self.workers)
        out["process_rss_mb"] = resident_bytes() / 2**20
        return out

    def _spawn(self, index: int) -> ThreadWorker:
        if self.stopping:
            raise Closing("the loader was closed while a worker was starting")
        w = ThreadWorker(index)
        self.board.claim(index, w.key)
        w.thread = threading.Thread(target=self._serve, args=(w,), name=f"granary-worker-{index}", daemon=True)
        try:
            w.thread.start()
        except RuntimeError as exc:  # "can't start new thread": a pids or memory limit
            raise WorkerError(
                f"could not start worker thread {index}: {exc}; lower worker_count, or raise "
                f"the limit on threads (a container's pids limit, ulimit -u)"
            ) from exc
        return w

    def _post(self, w: ThreadWorker, message: Any) -> None:
        with self._cond:
            self._events.append((w, message))
            self._cond.notify_all()

    def _serve(self, w: ThreadWorker) -> None:
        """The thread's loop: ``worker_init_fn``, then each unit of its inbox in order."""
        ended = False
        try:
            try:
                if self._init_fn is not None:
                    self._init_fn(w.index, self.slots)
            except BaseException:
                self._post(w, Fatal(traceback.format_exc()))
                ended = True
                return
            self._post(w, Ready(os.getpid()))
            plan, board = self._plan, self.board

            def report(stage: int) -> None:
                board.write(w.index, w.key, None, None, stage)

            while True:
                task = w.inbox.get()
                if task is None or w.gone:
                    ended = True
                    return
                generation, unit, start, stop = task
                board.write(w.index, w.key, generation, unit, 0)
                message: Any
                trial = self.trial if self.trial is not None and self.trial.verdict is None else None
                before = clocks() if trial is not None else None
                try:
                    # passthrough=(): Ctrl-C reaches the main thread only, so whatever
                    # is raised here comes from user code: the unit's error.
                    result = compute_unit(plan, start, stop, report, passthrough=())
                    if trial is not None and before is not None:
                        trial.record(w.index, before, clocks())
                    board.write(w.index, w.key, None, None, SENDING)
                    message = Done(generation, unit, None, 0, result)
                except BaseException as exc:
                    message = Failed(generation, unit, exc)
                board.write(w.index, w.key, None, None, IDLE)
                self._post(w, message)
        finally:
            if not ended and not w.gone:
                self._post(w, None)  # the loop itself failed: the thread is dead to the pool

    # -- units ----------------------------------------------------------------------------

    def send(self, w: ThreadWorker, generation: int, unit: int, start: int, stop: int, blocks_needed: int) -> None:
        """Queues the unit in the thread's inbox (OSError: the thread is gone)."""
        if w.gone:
            raise OSError(f"worker thread {w.index} is gone")
        if w.held:  # it is busy: a source that fetches reads this unit's records meanwhile
            hint_unit(self._plan, start, stop)
        w.held += 1
        w.inbox.put((generation, unit, start, stop))

    def give_back(self, token: Any) -> None:
        """Nothing was lent: results are objects."""

    def result(self, w: ThreadWorker, token: Any, message: Any, nbytes: int, blocks_needed: int) -> UnitResult:
        value: UnitResult = message.result
        value.worker, value.piped = w.index, False
        value.timings["transport"] = 0.0
        return value

    def error(self, w: ThreadWorker, payload: Any) -> Exception:
        """The exception the unit raised, as it was: a ``PipelineError`` names its record;
        anything else (a ``SystemExit`` too) arrives as a ``WorkerError`` chained to it."""
        if isinstance(payload, PipelineError):
            return payload
        error = WorkerError(f"worker thread {w.index} failed: {type(payload).__name__}: {payload}")
        error.__cause__ = payload
        return error

    def note_local_result(self, result: UnitResult, blocks_needed: int) -> None:
        """No blocks to size."""

    # -- listening ------------------------------------------------------------------------

    def events(self, timeout: float) -> Iterator[tuple[ThreadWorker, Any, int]]:
        """``(worker, message, 0)`` for the messages there within ``timeout`` seconds,
        taken one at a time (those of a worker left meanwhile are dropped)."""
        with self._cond:
            if not self._events and timeout > 0:
                self._cond.wait(timeout)
            count = len(self._events)
        for _ in range(count):
            with self._cond:
                if not self._events:
                    return
                w, message = self._events.popleft()
            if w.gone:
                continue
            if isinstance(message, (Done, Failed)):
                w.held -= 1
            yield w, message, 0

    def wait_readable(self, timeout: float) -> None:
        with self._cond:
            if not self._events:
                self._cond.wait(timeout)

    # -- ending ---------------------------------------------------------------------------

    def kill(self, w: ThreadWorker) -> None:
        """A thread cannot be killed: it is left to finish (see :meth:`bury`)."""

    def bury(self, w: ThreadWorker, timed_out: bool) -> int:
        w.leave()
        return 0

    def stop(self, w: ThreadWorker) -> None:
        """A retiring thread holds no unit: it exits."""
        w.leave()
        self.workers.remove(w)
        self.retired.append(w)

    def reap_retired(self) -> None:
        self.retired = [w for w in self.retired if w.thread is not None and w.thread.is_alive()]

    def close(self) -> None:
        """Tells every thread to stop after its current unit; does not wait for them (a
        thread in user code cannot be interrupted: it ends when the code returns)."""
        self.stopping = True
        for w in [*self.workers, *self.retired]:
            w.leave()
        self.workers.clear()
        self.retired.clear()
        with self._cond:
            self._events.clear()
            self._cond.notify_all()

    # -- looking --------------------------------------------------------------------------

    def worker_bytes(self) -> int:
        return 0

    def footprint(self) -> tuple[int, int, int, int | None]:
        """A thread costs what its units allocate (counted with the results), no
        interpreter and no result blocks."""
        return 0, 0, 0, None
