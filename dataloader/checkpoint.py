"""Orbax integration: the loader's position inside an Orbax checkpoint.

A training loop saves the iterator next to the model with Orbax's ``Composite`` args::

    import orbax.checkpoint as ocp
    mngr = ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(
        save_interval_steps=100, enable_async_checkpointing=True))
    mngr.save(step, args=ocp.args.Composite(
        params=ocp.args.StandardSave(params), data=dl.CheckpointSave(iterator)))
    ...
    restored = mngr.restore(mngr.latest_step(), args=ocp.args.Composite(
        params=ocp.args.StandardRestore(params), data=dl.CheckpointRestore(iterator)))

The iterator is anything with ``get_state()``/``set_state()``: a
:class:`~dataloader.DataLoaderIterator`, the device queue's iterator, or a Dataset API
iterator. ``CheckpointSave`` takes the state when it is constructed, i.e. when
``mngr.save(...)`` is called, so an asynchronous save never reads the iterator later
while the training loop has moved on.

Files. Each JAX process writes its own small JSON file, ``process_<i>-of-<n>.json``
(the state itself, as ``get_state()`` returned it), into the item's directory of the
checkpoint step; Orbax makes the step visible only once every process has finished,
so a preempted save leaves no half-written state behind.

Elastic restore. Restoring process ``i`` of ``n`` reads ``process_<i>-of-<n>.json``.
When the checkpoint was written by another number of processes and that file does not
exist, it reads ``process_0-of-<m>.json`` instead: all processes save at the same
global batch, so process 0's state holds the position every process needs, and the
loader maps it onto its own shard (see :mod:`dataloader.engine.state`: plain ``Batch``, same
global batch size). A state that does not fit the loader is refused with
:class:`~dataloader.StateMismatchError`, whose message names the file and every
difference.

This module imports Orbax and JAX; ``import dataloader`` loads it only on first use of
one of its names, so worker processes never import either.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath

from dataloader.errors import StateMismatchError

_FILE = re.compile(r"^process_(\d+)-of-(\d+)\.json$")


def state_filename(process_index: int, process_count: int) -> str:
    """The file name of one process's state, e.g. ``process_0-of-2.json``."""
    return f"process_{process_index}-of-{process_count}.json"


def _check_iterator(iterator: Any, role: str) -> None:
    for method in ("get_state", "set_state"):
        if not callable(getattr(iterator, method, None)):
            raise TypeError(
                f"{role} needs an iterator with get_state() and set_state() (a "
                f"DataLoaderIterator, a device iterator or a dataset iterator), got "
                f"{type(iterator).__name__} {iterator!r:.100}"
            )


def _state_text(iterator: Any) -> str:
    """The iterator's state now, as JSON text."""
    state = iterator.get_state()
    try:
        return json.dumps(state)
    except TypeError as error:
        raise TypeError(
            f"{type(iterator).__name__}.get_state() returned a state that is not JSON-able "
            f"({error}); a checkpointable iterator's state must be a dict of plain values"
        ) from None


def _existing_states(directory: epath.Path) -> dict[tuple[int, int], epath.Path]:
    found = {}
    if directory.exists():
        for path in directory.iterdir():
            match = _FILE.match(path.name)
            if match:
                found[(int(match.group(1)), int(match.group(2)))] = path
    return found


def find_state_file(directory: epath.Path, process_index: int, process_count: int) -> epath.Path:
    """The file process ``process_index`` of ``process_count`` restores from.

    Its own file when there is one; else, when the checkpoint was written by another
    number of processes, process 0's file (elastic restore).

    Raises:
        FileNotFoundError: no usable file; the message lists what the directory holds.
    """
    directory = epath.Path(directory)
    own = directory / state_filename(process_index, process_count)
    if own.exists():
        return own
    found = _existing_states(directory)
    counts = sorted({count for _, count in found})
    if len(counts) == 1 and counts[0] != process_count and (0, counts[0]) in found:
        return found[(0, counts[0])]
    names = sorted(path.name for path in found.values()) or "no state files"
    raise FileNotFoundError(
        f"no data-loader state for process {process_index} of {process_count} in "
        f"{directory}: expected {own.name}, found {names}; restore from a checkpoint "
        f"saved with dl.CheckpointSave"
    )


class IteratorCheckpointHandler(ocp.handlers.AsyncCheckpointHandler):
    """Saves and restores an iterator's state, one JSON file per JAX process.

    Orbax finds this handler through the argument classes :class:`CheckpointSave` and
    :class:`CheckpointRestore`; users rarely name it. With asynchronous checkpointing
    the (tiny) file is written in Orbax's background commit.

    Example:
        >>> mngr.save(step, args=ocp.args.Composite(        # doctest: +SKIP
        ...     data=dl.CheckpointSave(iterator)))
    """

    def _path(self, directory: epath.Path) -> epath.Path:
        return epath.Path(directory) / state_filename(jax.process_index(), jax.process_count())

    async def async_save(self, directory: epath.Path, args: CheckpointSave) -> list[Any]:
        path, text = self._path(directory), args.state

        async def write() -> None:
            path.write_text(text)

        return [ocp.future.CommitFutureAwaitingContractedSignals(write(), name="granary_state")]

    def save(self, directory: epath.Path, args: CheckpointSave) -> None:
        self._path(directory).write_text(args.state)

    def restore(self, directory: epath.Path, args: CheckpointRestore | None = None) -> Any:
        """Restores into ``args.item`` and returns it; returns the state dict without one.

        Raises:
            StateMismatchError: the state does not fit the iterator's loader.
            FileNotFoundError: the checkpoint holds no state for this process.
        """
        path = find_state_file(epath.Path(directory), jax.process_index(), jax.process_count())
        state = json.loads(path.read_text())
        iterator = None if args is None else args.item
        if iterator is None:
            return state
        try:
            iterator.set_state(state)
        except StateMismatchError as error:
            raise StateMismatchError(f"{path}: {error}") from error
        return iterator

    def metadata(self, directory: epath.Path) -> list[str]:
        """The names of the state files of a saved checkpoint item."""
        return sorted(path.name for path in _existing_states(epath.Path(directory)).values())


@ocp.args.register_with_handler(IteratorCheckpointHandler, for_save=True)
@dataclasses.dataclass
class CheckpointSave(ocp.args.CheckpointArgs):
    """Orbax save args: the position of ``item``, taken when this object is made.

    Args:
        item: an iterator with ``get_state()`` (DataLoaderIterator, device iterator,
            dataset iterator).

    Example:
        >>> mngr.save(step, args=ocp.args.Composite(        # doctest: +SKIP
        ...     params=ocp.args.StandardSave(params), data=dl.CheckpointSave(it)))
    """

    item: Any
    state: str = dataclasses.field(init=False, repr=False)

    def __post_init__(self) -> None:
        _check_iterator(self.item, "CheckpointSave")
        self.state = _state_text(self.item)


@ocp.args.register_with_handler(IteratorCheckpointHandler, for_restore=True)
@dataclasses.dataclass
class CheckpointRestore(ocp.args.CheckpointArgs):
    """Orbax restore args: ``item.set_state(saved state)``; the restore returns ``item``.

    Args:
        item: the iterator to move to the saved position (it must come from a loader
            the state fits), or ``None`` to get the saved state dict back instead
            (then ``loader.iterator(state)`` builds the iterator).

    Example:
        >>> it = iter(loader)                                 # doctest: +SKIP
        >>> mngr.restore(step, args=ocp.args.Composite(data=dl.CheckpointRestore(it)))
    """

    item: Any = None

    def __post_init__(self) -> None:
        if self.item is not None:
            _check_iterator(self.item, "CheckpointRestore")
