"""The device feed: batches already on the accelerator before the step asks for them.

Two threads and two bounded buffers sit between the source and the training step::

    source --(read thread)--> host queue --(transfer thread)--> device queue --> next()
                              cpu_buffer_size                   device_buffer_size

The read thread pulls batches from the source, checks them against the target
(:class:`~dataloader.device.placement.Placement`) and queues each with the source's state taken
right after pulling it. The transfer thread takes a slot in the device queue, then the
next host batch, and issues its transfer (``jax.device_put``, asynchronous, or
``jax.make_array_from_process_local_data`` across processes) as the batch enters the
device queue, so transfers overlap the step. ``next`` only pops a transferred batch.

Why the transfer has a thread of its own rather than being issued inside ``next``: on a
busy host any JAX call costs a few hundred microseconds of wake-up and dispatch right
after a step, which is 5-10% of a 5 ms step; off the training thread it costs the step
nothing (``benchmarks/device_step.py`` measures both).

Since every batch travels with the source's state, ``get_state`` describes the last
batch handed out, however many are still buffered; ``set_state`` drops both buffers and
restarts the source there, so nothing is lost or repeated.

``stats()`` has the source's numbers plus the feed's own: ``host_to_device`` (the
transfer thread's seconds from issuing a transfer to the batch being on the devices,
estimated from one batch in ``H2D_SAMPLE``: waiting for every transfer to finish would
keep the next one from being issued while the last is still copying; the wait comes
after the batch is in the device queue, so the step never waits for the measurement),
the step's own waiting in ``next()``, and the queues' depths.
"""

from __future__ import annotations

import contextlib
import copy
import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax

from dataloader.device.placement import Placement
from dataloader.engine.restore.protocol import StatePart
from dataloader.engine.stages.base import DatasetIterator, SupportsClose
from dataloader.engine.stats import collect
from dataloader.engine.stats.protocol import StatsParticipant
from dataloader.engine.stats.shape import empty_totals
from dataloader.options import check_int

BATCH, END, ERROR = "batch", "end", "error"
THREAD_PREFIX = "granary-device"
_POLL_S = 0.05  # how often a blocked thread looks for a stop request
CLOSE_WAIT_S = 10.0  # how long close() waits for a source call in progress

Item = tuple[str, Any, Any]  # (kind, batch or exception, source state)
DEPTH_SAMPLES = 4096  # queue depths kept for the report (one per step)
H2D_SAMPLE = 8  # one transfer in this many is waited for, to time host-to-device copies


class Depth(NamedTuple):
    """The queues as one ``next()`` found them: when (``time.monotonic()``), the host
    and device queues' depths, and how long the step then waited."""

    at: float
    host: int
    device: int
    waited: float


class FeedCounters:
    """What the feed measures, kept across restarts of its threads (``set_state``)."""

    def __init__(self) -> None:
        self.transfers = 0  # batches issued
        self.timed = 0  # of them, those waited for until on the devices (one in H2D_SAMPLE)
        self.timed_s = 0.0  # their seconds from issuing to done
        self.depths: deque[Depth] = deque(maxlen=DEPTH_SAMPLES)

    @property
    def put_s(self) -> float:
        """Seconds of all transfers, estimated from the timed ones."""
        return self.timed_s / self.timed * self.transfers if self.timed else 0.0


def _wake(lock: threading.Lock) -> None:
    """Releases a waiter's lock if it is armed; each lock has only one releaser."""
    if lock.locked():
        with contextlib.suppress(RuntimeError):
            lock.release()


class _Feed:
    """The two threads and their buffers; holds no reference to the iterator.

    The device buffer is a deque that only the transfer thread appends to and only the
    consumer pops from; two plain locks wake whichever side waits (the consumer for a
    batch, the transfer thread for room). Plain locks and deque calls run in C: the
    consumer's side of ``next`` costs a few microseconds where ``queue.Queue`` and
    ``Semaphore`` cost tens (measured on a 2-core VM right after a step).
    """

    def __init__(
        self, source: Any, placement: Placement, cpu_size: int, device_size: int, counters: FeedCounters
    ) -> None:
        self.counters = counters
        self.host: queue.Queue[Item] = queue.Queue(cpu_size)
        self.device: deque[Item] = deque()
        self.device_size = device_size
        self._ready = threading.Lock()  # armed (held) while the consumer may wait for a batch
        self._space = threading.Lock()  # armed while the transfer thread may wait for room
        self.stopping = threading.Event()
        self._source = source
        self._placement = placement
        self._state = getattr(source, "get_state", None)
        self.threads = [
            threading.Thread(target=self._read, name=f"{THREAD_PREFIX}-read", daemon=True),
            threading.Thread(target=self._transfer, name=f"{THREAD_PREFIX}-transfer", daemon=True),
        ]
        # Both threads wait for `go` until both are started: a read thread computing its
        # first batch holds the GIL, and Thread.start() (which waits for the new thread)
        # then waited up to the interpreter's 5 ms switch interval for it, twice.
        self._go = threading.Event()
        for thread in self.threads:
            thread.start()
        self._go.set()

    def _read(self) -> None:
        self._go.wait()
        try:
            while not self.stopping.is_set():
                try:
                    batch = next(self._source)
                except StopIteration:
                    self._put(self.host, (END, None, self._state() if self._state else None))
                    return
                state = self._state() if self._state else None
                if not self._put(self.host, (BATCH, self._placement.check(batch), state)):
                    return
                # Give the GIL up now, so the transfer thread issues this batch's
                # transfer at once rather than after up to the interpreter's 5 ms
                # switch interval of this thread computing the next one (~1 us).
                time.sleep(0)
        except BaseException as e:  # handed to the consumer, with its type
            self._put(self.host, (ERROR, e, None))

    def _transfer(self) -> None:
        self._go.wait()
        kind = BATCH
        while kind == BATCH:
            if not self._wait_for_space():
                return
            item = self._take(self.host)
            if item is None:
                return
            kind, value, state = item
            began = time.monotonic()
            if kind == BATCH:
                try:
                    value = self._placement.put(value)
                except Exception as e:  # a failed transfer takes the batch's place
                    kind, value, state = ERROR, e, None
            self.device.append((kind, value, state))
            _wake(self._ready)
            counters = self.counters
            if kind == BATCH:
                counters.transfers += 1
                if counters.transfers % H2D_SAMPLE == 1:
                    # Measured once the batch is queued, so the step never waits for it.
                    # A step that donated the batch may have deleted it already: then the
                    # issuing time is all there is.
                    with contextlib.suppress(Exception):
                        jax.block_until_ready(value)
                    counters.timed += 1
                    counters.timed_s += time.monotonic() - began
            value = state = None  # hold no batch while waiting for room

    def _wait_for_space(self) -> bool:
        while True:
            self._space.acquire(blocking=False)  # arm: the consumer's next pop releases it
            if len(self.device) < self.device_size:
                return True
            if self.stopping.is_set():
                return False
            self._space.acquire(timeout=_POLL_S)

    def _take(self, q: queue.Queue[Item]) -> Item | None:
        while not self.stopping.is_set():
            try:
                return q.get(timeout=_POLL_S)
            except queue.Empty:
                continue
        return None

    def _put(self, q: queue.Queue[Item], item: Item) -> bool:
        while not self.stopping.is_set():
            try:
                q.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def get(self) -> Item:
        """The next transferred item, waiting for it; makes room for the next transfer."""
        device = self.device
        while True:
            try:
                item = device.popleft()
            except IndexError:
                self._ready.acquire(blocking=False)  # arm: the next append releases it
                if device:
                    continue
                ready = self._ready.acquire(timeout=1.0)
                if not ready and not self.threads[1].is_alive() and not device:
                    return (ERROR, RuntimeError("the device feed threads ended unexpectedly"), None)
                continue
            _wake(self._space)
            return item

    def stop(self, timeout: float | None = None) -> None:
        """Stops both threads (after a source call in progress, if any); drops the queues.

        Waits up to ``timeout`` seconds for each thread (``None``: as long as it takes).
        """
        self.stopping.set()
        self._drain()
        for thread in self.threads:
            if thread is not threading.current_thread():
                thread.join(timeout)
        self._drain()

    def _drain(self) -> None:
        self.device.clear()
        while True:
            try:
                self.host.get_nowait()
            except queue.Empty:
                break


class _Resources:
    """What the iterator's finalizer must release; the iterator itself it must not hold."""

    def __init__(self, source: Any) -> None:
        self.source = source
        self.feed: _Feed | None = None
        self.counters = FeedCounters()


def _shutdown(res: _Resources) -> None:
    if res.feed is not None:
        res.feed.stopping.set()
        if isinstance(res.source, DatasetIterator) and res.source.closes_from_any_thread:
            # It says it closes safely from any thread and ends a next() in progress at
            # once (a loader's, waiting on a stuck worker, say), so the read thread stops
            # now. Other sources are closed only after their thread, which might be
            # inside them (a generator cannot be closed while it runs).
            res.source.close()
        # Bounded, so that a source stuck in next() cannot hang close() or interpreter
        # exit; closing the source below is what ends such a call.
        res.feed.stop(timeout=CLOSE_WAIT_S)
    if isinstance(res.source, SupportsClose):
        res.source.close()


class DeviceIterator(DatasetIterator[Any]):
    """Prefetches a source's batches onto devices; checkpointable at every step.

    Made by :func:`device_prefetch`. A :class:`~dataloader.DatasetIterator` whose parent
    is the source: leaves come out as ``jax.Array`` placed on the target.
    ``get_state()`` is the source's state after the last batch handed out (not after
    what is prefetched), ``set_state(state)`` continues right after it, and ``close()``
    (or leaving a ``with`` block, or garbage collection) stops the feed threads, drops
    both buffers and closes the source.

    Example:
        >>> import dataloader as dl
        >>> loader = dl.DataLoader(dl.RangeDataSource(8), dl.SequentialSampler(8),
        ...                        [dl.Batch(4)])
        >>> with dl.device_prefetch(loader) as it:
        ...     first = next(it)
        ...     state = it.get_state()
        >>> first.tolist(), state["position"]
        ([0, 1, 2, 3], 4)
    """

    stats_exact = True  # its calls are a training step's: time every one, never sample

    def __init__(
        self,
        source: Any,
        target: Any = None,
        *,
        cpu_buffer_size: int = 2,
        device_buffer_size: int = 2,
    ) -> None:
        self.cpu_buffer_size = check_int("cpu_buffer_size", cpu_buffer_size, 1)
        self.device_buffer_size = check_int("device_buffer_size", device_buffer_size, 1)
        self._placement = Placement(target)
        if not hasattr(source, "__next__"):
            if not hasattr(source, "__iter__"):
                raise TypeError(
                    f"source must be a DataLoader, a loader iterator or an iterator of "
                    f"batches, got {type(source).__name__}: {source!r}"
                )
            source = iter(source)
        super().__init__((source,))
        self._res = _Resources(source)
        self._finalizer = weakref.finalize(self, _shutdown, self._res)
        self._state: Any = source.get_state() if hasattr(source, "get_state") else None
        self._finished = False
        self._start()

    def _start(self) -> None:
        self._res.feed = _Feed(
            self._res.source, self._placement, self.cpu_buffer_size, self.device_buffer_size,
            self._res.counters,
        )

    @property
    def sharding(self) -> Any:
        """The ``jax.sharding.Sharding`` every leaf is placed with."""
        return self._placement.sharding

    def __next__(self) -> Any:
        # Run under the stats clock (DatasetIterator wraps it), timing every call:
        # they are the training step's, one a step.
        if self._finished or not self._finalizer.alive:
            raise StopIteration
        feed = self._res.feed
        assert feed is not None
        began, host, device = time.monotonic(), feed.host.qsize(), len(feed.device)
        kind, value, state = feed.get()
        feed.counters.depths.append(Depth(began, host, device, time.monotonic() - began))
        if kind == BATCH:
            self._state = state
            return value
        self._finished = True
        feed.stop()
        if kind == END:
            self._state = state if state is not None else self._state
            raise StopIteration
        raise value

    def get_state(self) -> dict[str, Any]:
        """The source's state right after the last batch this iterator handed out.

        Raises:
            TypeError: the source has no ``get_state``.
        """
        if not hasattr(self._res.source, "get_state"):
            raise TypeError(
                f"the source {type(self._res.source).__name__} has no get_state(), so the "
                f"device iterator cannot be checkpointed; feed it a DataLoader, its "
                f"iterator, or an iterator with get_state()/set_state()"
            )
        return copy.deepcopy(self._state)

    def set_state(self, state: Any) -> None:
        """Continues right after the batch ``state`` describes (from ``get_state``).

        Stops the feed threads, drops both buffers, restores the source and starts again.

        Raises:
            TypeError: the source has no ``set_state``.
            RuntimeError: the iterator was closed.
            StateMismatchError: (from a loader) the state does not fit the loader.
        """
        source = self._res.source
        if not hasattr(source, "set_state"):
            raise TypeError(
                f"the source {type(source).__name__} has no set_state(), so the device "
                f"iterator cannot be restored; feed it a DataLoader or its iterator"
            )
        self._restart(lambda: source.set_state(state))

    def _restart(self, move: Callable[[], None]) -> None:
        """Stops the feed threads, drops both buffers, moves the source, starts again."""
        if not self._finalizer.alive:
            raise RuntimeError("set_state on a closed device iterator; make a new one")
        if self._res.feed is not None:
            self._res.feed.stop()
        move()
        self._state = self._res.source.get_state() if hasattr(self._res.source, "get_state") else None
        self._finished = False
        self._start()

    # The elastic-restore protocol (dataloader.engine.restore.protocol.ElasticStage): its
    # state is its source's (a loader's iterator restores from every old process's
    # states, so an Orbax restore on another process count hands them over).

    @property
    def elastic_parent(self) -> Any:
        return self._res.source

    def last_tag(self) -> Any:
        return None  # batches, and read ahead

    def split_state(self, state: Any) -> StatePart:
        return StatePart(state)

    def restart_elastic(self, resume: Callable[[], None], kept: Sequence[Any]) -> None:
        self._restart(resume)

    def start_prefetch(self) -> None:
        """Nothing to do: the feed's threads read ahead from construction on (asking the
        source here would race the read thread, which is inside it)."""

    def stats(self) -> dict[str, Any]:
        """The source's stats (when it has them) with the feed's: ``host_to_device``
        among the stages, the step's own waiting as ``wait_s``/``wait_share``, the
        batches it handed out, and the queues' depths now (see the module docstring)."""
        feed = self._res.feed
        queues = {
            "host": feed.host.qsize() if feed is not None else 0,
            "host_capacity": self.cpu_buffer_size,
            "device": len(feed.device) if feed is not None else 0,
            "device_capacity": self.device_buffer_size,
        }
        return collect.stats_of(self, queues)

    @property
    def depth_samples(self) -> list[Depth]:
        """The queues' depths at each of the last ``DEPTH_SAMPLES`` steps (for reports)."""
        return list(self._res.counters.depths)

    def stats_totals(self) -> dict[str, Any]:
        source = self._res.source
        totals = source.stats_totals() if isinstance(source, StatsParticipant) else empty_totals()
        stages = totals["stage_seconds"]
        stages["host_to_device"] = stages.get("host_to_device", 0.0) + self._res.counters.put_s
        clock = collect.clock_of(self)
        totals["batches_out"] = clock.outputs
        totals["wait_s"] = clock.wait_s()
        return totals

    def stats_pipeline(self) -> dict[str, Any]:
        source = self._res.source
        pipeline = source.stats_pipeline() if isinstance(source, StatsParticipant) else {}
        pipeline["device_feed"] = {
            "cpu_buffer_size": self.cpu_buffer_size, "device_buffer_size": self.device_buffer_size,
        }
        return pipeline

    def close(self) -> None:
        """Stops the feed threads, drops the buffers and closes the source; idempotent."""
        self._closed = True
        self._finalizer()

    def __enter__(self) -> DeviceIterator:
        return self


def device_prefetch(
    source: Any,
    target: Any = None,
    *,
    cpu_buffer_size: int = 2,
    device_buffer_size: int = 2,
) -> DeviceIterator:
    """Feeds ``source``'s batches to devices, a few steps ahead of the training loop.

    Args:
        source: a :class:`~dataloader.DataLoader` (iterated from the start), its
            iterator, or any iterator of pytrees (dicts, tuples, lists) of numeric
            numpy arrays; with ``get_state``/``set_state`` it can be checkpointed.
        target: ``None`` (this process's first device), a ``jax.Device``, or a
            ``jax.sharding.Sharding``. A ``NamedSharding(mesh, PartitionSpec("data"))``
            splits each leaf's leading (batch) axis over the mesh axis ``"data"``;
            when the mesh spans several JAX processes each process's batch becomes its
            part of one global ``jax.Array``.
        cpu_buffer_size: batches a background thread keeps ready on the host (>= 1).
        device_buffer_size: batches kept already transferred, beyond the ones handed
            out (>= 1).

    Returns:
        A :class:`DeviceIterator`.

    Raises:
        TypeError: the target is not a device or sharding, or the source not iterable.
        ValueError: a buffer size is not a positive integer.

    Example:
        >>> import dataloader as dl
        >>> loader = dl.DataLoader(dl.RangeDataSource(8), dl.SequentialSampler(8),
        ...                        [dl.Batch(4)])
        >>> [int(b.sum()) for b in dl.device_prefetch(loader)]
        [6, 22]
    """
    return DeviceIterator(
        source,
        target,
        cpu_buffer_size=cpu_buffer_size,
        device_buffer_size=device_buffer_size,
    )
