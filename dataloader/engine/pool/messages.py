"""What the parent and a worker say to each other, one named tuple per message.

Each message is pickled on its own and sent as one frame of a pipe. Parent to worker:
one :class:`Init`, then :class:`Task` after :class:`Task`; closing the pipe means stop.
Worker to parent: :class:`Ready` once started, then one :class:`Done` or :class:`Failed`
per task, in the order the tasks came; :class:`Fatal` instead of :class:`Ready` when
start-up fails.

``generation`` numbers the stream a task belongs to: a restore (``set_state``) starts a
new one, and answers about the old one are dropped.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class WorkerConfig(NamedTuple):
    """Everything a worker needs before its first task (carried by :class:`Init`).

    Attributes:
        parent_pid: the training process, watched so an orphaned worker exits.
        plan: the pipeline's plan, pickled with cloudpickle.
        init_fn: the user's ``worker_init_fn`` (or None), pickled with cloudpickle.
        worker_index, worker_count: this worker's slot and the pool's size.
        cpus: the CPUs the worker may use once started.
        block_prefix: the names of the pool's shared-memory blocks start with it.
    """

    parent_pid: int
    plan: bytes
    init_fn: bytes
    worker_index: int
    worker_count: int
    cpus: tuple[int, ...]
    block_prefix: str


class Init(NamedTuple):
    config: WorkerConfig


class Task(NamedTuple):
    """Compute the unit of local positions ``[start, stop)``.

    Attributes:
        block: the shared-memory block lent for the result, or None (use the pipe).
        forget: names of blocks the parent has discarded since this worker's last task;
            the worker unmaps them.
    """

    generation: int
    unit: int
    start: int
    stop: int
    block: str | None
    forget: tuple[str, ...]


class Ready(NamedTuple):
    pid: int


class Done(NamedTuple):
    """A unit's result: in the lent block (``layout`` says where its parts are, ``size``
    how many bytes it took), or pickled in ``result`` itself when there was no block or
    it was too small."""

    generation: int
    unit: int
    layout: list[tuple[int, int]] | None
    size: int
    result: Any


class Failed(NamedTuple):
    """The unit raised; ``error`` is the exception, its cause and the child's traceback,
    pickled with cloudpickle."""

    generation: int
    unit: int
    error: bytes


class Fatal(NamedTuple):
    """Start-up failed (the plan or ``worker_init_fn`` raised); the child's traceback."""

    traceback: str
