"""What the parent and a worker say to each other, one named tuple per message.

Each message is pickled on its own and sent as one frame of a pipe (the task channel is
a Unix socket, so that descriptors can follow a task). Parent to worker: one
:class:`Init`, then :class:`Task` after :class:`Task`; closing the channel means stop.
Worker to parent: :class:`Ready` once started, then one :class:`Done` or :class:`Failed`
per task, in the order the tasks came; :class:`Fatal` instead of :class:`Ready` when
start-up fails.

``generation`` numbers the stream a task belongs to: a restore (``set_state``) starts a
new one, and answers about the old one are dropped.

The two payloads pickled with cloudpickle are made and read here too: the plan in
:class:`WorkerConfig` (:func:`pickle_plan`, checked by :mod:`.pickling`) and the error in
:class:`Failed` (:func:`error_payload` in the worker, :func:`remote_error` in the parent).
"""

from __future__ import annotations

import traceback
from typing import TYPE_CHECKING, Any, NamedTuple

import cloudpickle

from dataloader.engine.pool.pickling import PickledPlan, dumps_checked
from dataloader.errors import PipelineError, WorkerError

if TYPE_CHECKING:
    from dataloader.engine.plan import Plan


class WorkerConfig(NamedTuple):
    """Everything a worker needs before its first task (carried by :class:`Init`).

    Attributes:
        parent_pid: the training process, watched so an orphaned worker exits.
        plan: the pipeline's plan, pickled with cloudpickle.
        init_fn: the user's ``worker_init_fn`` (or None), pickled with cloudpickle.
        worker_index, worker_count: this worker's slot and the pool's size.
        cpus: the CPUs the worker may use once started.
        progress_fd: the inherited descriptor of the pool's progress board (slot
            ``worker_index``), or -1 when there is none.
    """

    parent_pid: int
    plan: bytes
    init_fn: bytes
    worker_index: int
    worker_count: int
    cpus: tuple[int, ...]
    progress_fd: int = -1


class Init(NamedTuple):
    config: WorkerConfig


class Task(NamedTuple):
    """Compute the unit of local positions ``[start, stop)``.

    Attributes:
        block: the number of the shared-memory block lent for the result, or None (use
            the pipe). When the worker does not hold that block yet, its descriptor
            follows the task on the channel (one byte carrying it, ``SCM_RIGHTS``).
        forget: the blocks the parent has discarded since this worker's last task; the
            worker unmaps them and closes their descriptors.
    """

    generation: int
    unit: int
    start: int
    stop: int
    block: int | None
    forget: tuple[int, ...]


class Ready(NamedTuple):
    pid: int


class Done(NamedTuple):
    """A unit's result: in the lent block (``layout`` says where its parts are, ``size``
    how many bytes it took; more than the block had when the worker grew it), or
    pickled in ``result`` itself when there was no block or it could not be grown."""

    generation: int
    unit: int
    layout: list[tuple[int, int]] | None
    size: int
    result: Any


class Failed(NamedTuple):
    """The unit raised; ``error`` is the exception, its cause and the child's traceback,
    pickled with cloudpickle (from a process), or the exception itself (from a thread)."""

    generation: int
    unit: int
    error: bytes | BaseException


class Fatal(NamedTuple):
    """Start-up failed (the plan or ``worker_init_fn`` raised); the child's traceback."""

    traceback: str


def pickle_plan(plan: Plan) -> PickledPlan:
    """The plan as sent to workers, checked to unpickle (:mod:`.pickling`): an object that
    cannot make the trip is named by its path (``operations[2].fn._tokenizer...``)."""
    parts: list[tuple[str, Any, str]] = [("data_source", plan.source, ""), ("sampler", plan.sampler, "")]
    parts += [(f"operations[{s.stream}]", s.op, f"operation {s.op.name}") for s in plan.pre]
    if plan.batch is not None:
        parts.append(("the batch", plan.batch, plan.batch.name))
    parts += [(f"operations[{s.stream}]", s.op, f"operation {s.op.name}") for s in plan.post]
    return dumps_checked(plan, "the pipeline", parts)


def remote_error(data: bytes, worker: int) -> Exception:
    """Rebuilds a worker's exception with the child's traceback in its message.

    Never re-raises the child's exception itself: a ``SystemExit`` that is not a
    ``PipelineError`` arrives as a ``WorkerError`` chained to it.
    """
    exc, cause, text = cloudpickle.loads(data)
    detail = f"\n\nTraceback in worker {worker}:\n{text}"
    if exc is None:
        return WorkerError(f"worker {worker} failed (its exception did not pickle){detail}")
    if isinstance(exc, PipelineError):
        err: Exception = PipelineError(
            f"{exc}{detail}",
            operation=exc.operation,
            record_index=exc.record_index,
            position=exc.position,
        )
        err.__cause__ = cause
    else:
        err = WorkerError(f"worker {worker} failed: {type(exc).__name__}: {exc}{detail}")
        err.__cause__ = exc
    return err


def error_payload(exc: BaseException) -> bytes:
    """The exception, its cause and the child's traceback, picklable whatever they are.

    What does not pickle is left out, the error before the traceback text: a
    ``PipelineError`` whose cause cannot be pickled still arrives as itself.
    """
    text = "".join(traceback.format_exception(exc))
    for payload in ((exc, exc.__cause__, text), (exc, None, text)):
        try:
            return cloudpickle.dumps(payload)
        except Exception:
            continue
    return cloudpickle.dumps((None, None, text))
