"""The loader's exceptions, each a subclass of the nearest builtin so callers can catch either.

```
GranaryError
├── ConfigError (ValueError)          a pipeline config is invalid (message starts with the key)
├── ConvertError (ValueError)         conversion to ArrayRecord met bad input or existing output
├── StateMismatchError (ValueError)   a saved state does not fit this loader
├── PipelineError (RuntimeError)      user code or a read failed; chained to the original
├── LoaderClosedError (RuntimeError)  close() ended a next() that was waiting
└── WorkerError (RuntimeError)        the worker pool could not do its job
    ├── WorkerCrashError              a unit killed its worker too many times
    └── WorkerTimeoutError            a unit ran past ``unit_timeout_s``; its worker was killed
```
The packages ``samplers``, ``sources`` and ``operations`` raise builtin exceptions only
(``ValueError``, ``TypeError``, ...); these classes belong to the orchestration layer.
"""

from __future__ import annotations


class GranaryError(Exception):
    """Base of every error the loader raises itself."""


class ConfigError(GranaryError, ValueError):
    """A pipeline config is invalid; the message starts with the offending key."""


class ConvertError(GranaryError, ValueError):
    """Converting files to ArrayRecord failed: a bad input (the message names the file and
    where in it), an existing output that was not to be replaced, or a failed check."""


class StateMismatchError(GranaryError, ValueError):
    """A state was saved for another data set, seed, sharding or pipeline."""


class PipelineError(GranaryError, RuntimeError):
    """An operation or a read failed on a record; ``__cause__`` is the original exception.

    Attributes:
        operation: the name of the failing operation (or ``"read"``).
        record_index: the record index in the data source, where one is known.
        position: the position in this shard's stream.
    """

    def __init__(
        self,
        message: str,
        *,
        operation: str,
        record_index: int | None = None,
        position: int | None = None,
    ) -> None:
        super().__init__(message)
        self.operation = operation
        self.record_index = record_index
        self.position = position

    def __reduce__(self):  # keep the keyword fields across pickling (worker -> parent)
        return (
            _rebuild_pipeline_error,
            (self.args[0], self.operation, self.record_index, self.position),
        )


def _rebuild_pipeline_error(message, operation, record_index, position) -> PipelineError:
    return PipelineError(
        message, operation=operation, record_index=record_index, position=position
    )


class LoaderClosedError(GranaryError, RuntimeError):
    """``close()`` (from another thread) ended a ``next()`` that was waiting for results."""


class WorkerError(GranaryError, RuntimeError):
    """The worker pool failed (a child could not start, or died and could not be replaced)."""


class WorkerCrashError(WorkerError):
    """A unit of work killed its worker process repeatedly (a poison record), or lost it
    to the kernel's OOM killer each time (then the message names the memory limit and
    what to lower, and blames no record)."""


class WorkerTimeoutError(WorkerError):
    """A unit ran longer than ``unit_timeout_s``; its worker was killed and replaced.

    Raised at the unit's place in the stream; the unit is not computed again.

    Attributes:
        operation: the operation the worker was in (``"read"``, an operation's name, or
            ``"sending the result"``).
        record_indices: the record indices of the unit, in stream order.
        position: the unit's first position in this shard's stream.
        worker: the index of the worker (its slot in the pool).
    """

    def __init__(
        self,
        message: str,
        *,
        operation: str,
        record_indices: list[int],
        position: int,
        worker: int,
    ) -> None:
        super().__init__(message)
        self.operation = operation
        self.record_indices = record_indices
        self.position = position
        self.worker = worker

    def __reduce__(self):  # keep the keyword fields across pickling
        return (
            _rebuild_timeout_error,
            (self.args[0], self.operation, self.record_indices, self.position, self.worker),
        )


def _rebuild_timeout_error(message, operation, record_indices, position, worker) -> WorkerTimeoutError:
    return WorkerTimeoutError(
        message,
        operation=operation,
        record_indices=record_indices,
        position=position,
        worker=worker,
    )
