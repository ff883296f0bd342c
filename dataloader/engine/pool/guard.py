"""The pool's threads: calls serialised by one lock, ``close()`` from any thread, and work
started before the first ``next()``.

:class:`Guarded` is the part of :class:`~dataloader.engine.pool.executor.PoolExecutor`
that knows about threads, and nothing about units or processes. The scheduling loop
below it runs with the lock held, one call at a time.

* ``close()`` never waits on a stuck ``next()``: the consumer polls in steps of at most
  0.25 s and gives the lock up, with a :class:`~dataloader.errors.LoaderClosedError`,
  once it sees that ``close()`` was called. Only a ``next()`` busy in user code in this
  process (a unit computed here with the ``warm_start=True`` opt-in) cannot give it up;
  ``close()`` then releases the workers and blocks without it, after ``CLOSE_WAIT_S``.
* A start-up thread takes in what the workers say and hands out the first units as soon
  as they are ready, before the first ``next()``, so the pool works while the training
  script is still setting up (compiling its step, restoring a checkpoint). It goes on
  after the first ``next()`` until every worker is ready, so a late one gets its units
  while the consumer is away, then ends: the steady state has no thread of its own.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Any

from dataloader.engine.pool.window import Window
from dataloader.engine.pool.workers import Closing, Workers
from dataloader.errors import LoaderClosedError

CLOSE_WAIT_S = 1.0  # how long close() waits for a next() in progress to give way


def _release(workers: Workers) -> None:
    """Stops every worker within a bounded time and lets go of every result block."""
    workers.close()


class Guarded:
    """Thread safety for the loop of a subclass, which hands its worker set to
    :meth:`_own`, keeps its ``_window``, and provides ``_next_locked()``,
    ``_wait(timeout)`` and ``_dispatch()`` (run with the lock held).
    """

    _window: Window

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._closing = False
        self._consumer_started = False
        self._prestart_error: Exception | None = None

    def _own(self, workers: Workers) -> None:
        """Takes the workers (and their blocks) of a (re)started pool: released by
        ``close()``, by an error that ends the stream, or when the executor is collected."""
        self._workers = workers
        self._finalizer = weakref.finalize(self, _release, workers)

    def _start_early(self) -> None:
        # No thread left (a pids limit): no early start; the first next() starts the work.
        with contextlib.suppress(RuntimeError):
            threading.Thread(
                target=Guarded._prestart, args=(weakref.ref(self),), name="granary-prestart", daemon=True
            ).start()

    @staticmethod
    def _prestart(ref: weakref.ref[Guarded]) -> None:
        """Runs start-up rounds until the consumer has started and every worker is ready,
        or the executor is closed or collected (it holds only a weak reference between
        rounds, and no lock while it waits)."""
        workers = Guarded._early_round(ref, work=False)
        while workers is not None:
            workers.wait_readable(0.05)
            workers = Guarded._early_round(ref, work=True)

    @staticmethod
    def _early_round(ref: weakref.ref[Guarded], work: bool) -> Workers | None:
        """The worker set to wait on, after taking in what it said and handing out units
        (``work``); None once start-up work is no longer wanted, or failed."""
        executor = ref()
        if executor is None:
            return None
        with executor._lock:
            # Checked under the lock: the consumer may have started, or the pool been
            # closed (then its pipes are closed and must not look like dead workers).
            if not executor._wanted_early():
                return None
            if work:
                try:
                    executor._wait(0)
                    executor._dispatch()
                except Exception as exc:  # e.g. a worker that cannot start
                    executor._prestart_error = exc
                    return None
            return executor._workers

    def _wanted_early(self) -> bool:
        """Before the first ``next()``; after it, until every worker started is ready: the
        consumer takes in what workers say only while it is in ``next()``, so a worker
        ready while the consumer is away (its training step, a compile) would otherwise
        sit idle until the consumer's next call, its share of the window unsent."""
        if self._closing or not self._finalizer.alive:
            return False
        return not self._consumer_started or not all(w.ready for w in self._workers.workers)

    def __iter__(self) -> Guarded:
        return self

    def __next__(self) -> Any:
        with self._lock:
            self._consumer_started = True
            if self._prestart_error is not None:
                error, self._prestart_error = self._prestart_error, None
                raise self._closed_error() if isinstance(error, Closing) else error
            if not self._finalizer.alive:
                raise StopIteration
            try:
                return self._next_locked()
            except (OSError, ValueError, Closing) as exc:  # closed under a busy call
                if self._closing:
                    raise self._closed_error() from exc
                raise

    def close(self) -> None:
        """Stops every worker and lets go of every block, from any thread, in bounded time.

        A ``next()`` waiting in another thread raises
        :class:`~dataloader.errors.LoaderClosedError` within a fraction of a second and
        gives way; one busy in user code in this process is not waited for beyond
        ``CLOSE_WAIT_S`` (the workers are stopped under it).
        """
        self._closing = self._workers.stopping = True
        locked = self._lock.acquire(timeout=CLOSE_WAIT_S)
        try:
            self._finalizer()
        finally:
            if locked:
                self._lock.release()

    def _closed_error(self) -> LoaderClosedError:
        return LoaderClosedError(
            f"the loader was closed while next() waited for unit {self._window.head}; "
            f"this iterator is finished: make a new one (or set_state) to go on"
        )

    @property
    def pids(self) -> list[int]:
        return [w.pid for w in self._workers.workers]

    @property
    def worker_kind(self) -> str:
        """``"processes"`` or ``"threads"``: what computes the units."""
        return self._workers.kind

    # -- what the loop provides -------------------------------------------------------------

    def _next_locked(self) -> Any:
        raise NotImplementedError

    def _wait(self, timeout: float) -> None:
        raise NotImplementedError

    def _dispatch(self) -> None:
        raise NotImplementedError

