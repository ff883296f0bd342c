"""The loader's exceptions, each a subclass of the nearest builtin so callers can catch either.

```
GranaryError
├── ConfigError (ValueError)          a pipeline config is invalid (message starts with the key)
├── ConvertError (ValueError)         conversion to ArrayRecord met bad input or existing output
├── StateMismatchError (ValueError)   a saved state does not fit this loader
├── PipelineError (RuntimeError)      user code or a read failed; chained to the original
└── WorkerError (RuntimeError)        the worker pool could not do its job
    └── WorkerCrashError              a unit killed its worker too many times
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


class WorkerError(GranaryError, RuntimeError):
    """The worker pool failed (a child could not start, or died and could not be replaced)."""


class WorkerCrashError(WorkerError):
    """A unit of work killed its worker process repeatedly (a poison record)."""
