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
exist, an iterator that takes part in an elastic restore (a loader's, and stages over
it: :func:`~dataloader.engine.restore.protocol.takes_every_host`) is given every old
process's state, and reads its share of what they left unread, for every pipeline
(:mod:`dataloader.engine.restore`); another iterator reads
``process_0-of-<m>.json`` instead: all processes save at the same global batch, so
process 0's state holds the position every process needs, and the loader maps it onto
its own shard (see :mod:`dataloader.engine.state`: plain ``Batch``, same global batch
size). A state that does not fit the loader is refused with
:class:`~dataloader.StateMismatchError`, whose message names the file and every
difference.

Grain's names. Code written for Grain's Orbax handler runs unchanged:
:class:`PyGrainCheckpointHandler` with :class:`PyGrainCheckpointSave` and
:class:`PyGrainCheckpointRestore` (Grain exports them from ``grain.python`` and, without
the prefix, from ``grain.checkpoint``). Its contract is Grain's: synchronous
``save(directory, item=None, args=None)`` and ``restore(directory, item=None, args=None)``
that a subclass overrides and calls back (MaxText's ``GrainCheckpointHandler`` does), the
state taken when ``save`` runs, the same file names. On top of Grain's, its restore reads
process 0's file on another process count (as above) and converts a state that Grain's
own ``DataLoader`` wrote where the continuation is exact
(:mod:`dataloader.engine.restore.grain`).

Orbax v1. Every :class:`~dataloader.DatasetIterator` (a DataLoader's, a dataset's, the
device queue's) is also a ``StatefulCheckpointable`` of ``orbax.checkpoint.v1``, as
Grain's iterators are: ``ocp.save_checkpointables(path, {"iter": it})`` and
``ocp.load_checkpointables(path, {"iter": it})`` write and read the same files, through
:func:`v1_save` and :func:`v1_load`.

This module imports Orbax and JAX; ``import dataloader`` loads it only on first use of
one of its names, so worker processes never import either.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from collections.abc import Coroutine
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath

from dataloader.engine.restore import grain as grain_state
from dataloader.engine.restore.protocol import takes_every_host
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


def _state_text(iterator: Any, indent: int | None = None) -> str:
    """The iterator's state now, as JSON text (JSON bytes, which Grain's DataLoader hands
    out, are decoded as they are)."""
    state = iterator.get_state()
    if isinstance(state, (bytes, bytearray)):
        return bytes(state).decode()
    try:
        return json.dumps(state, indent=indent)
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


def _read_state_file(path: epath.Path) -> dict[str, Any]:
    """The state dict in one process's file.

    Raises:
        ValueError: the file is damaged (empty, cut short, not UTF-8, not JSON, or JSON
            that is not an object); the message names the file and what is wrong with it.
    """
    data = path.read_bytes()
    fix = (
        "it changed after the checkpoint was committed (a failed disk, copy or edit); "
        "restore an earlier step (CheckpointManager.restore(step) with one of "
        "CheckpointManager.all_steps()) or put back this file from a copy"
    )
    try:
        state = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise ValueError(
            f"the data-loader state file {path} is damaged: byte {error.start} of its "
            f"{len(data)} is not UTF-8 text, so it is not a saved state; {fix}"
        ) from error
    except json.JSONDecodeError as error:
        what = "it is empty" if not data.strip() else (
            f"it is not valid JSON at line {error.lineno}, column {error.colno} "
            f"(byte {error.pos} of {len(data)}): {error.msg}"
        )
        raise ValueError(f"the data-loader state file {path} is damaged: {what}; {fix}") from error
    if not isinstance(state, dict):
        raise ValueError(
            f"the data-loader state file {path} is damaged: it holds {data[:40]!r}, where a "
            f"saved state is a JSON object; {fix}"
        )
    return state


def _restore_from(path: epath.Path, iterator: Any) -> Any:
    """Sets ``iterator`` to the state in ``path`` and returns it (the state without one).

    A state that Grain's DataLoader wrote is converted first, where that is exact; one
    of Grain's dataset iterators (``{"next_index": n}``) is converted by the iterator's
    ``set_state``, which knows the order of its stream.
    """
    state = _read_state_file(path)
    if iterator is None:
        return state
    try:
        if grain_state.is_grain_state(state) and "last_seen_indices" in state:
            current = iterator.get_state()
            if isinstance(current, dict) and "made_for" in current:
                current.pop("fingerprint", None)  # the restoring iterator's last step, not Grain's
                state = grain_state.from_grain(state, current)
        iterator.set_state(state)
    except StateMismatchError as error:
        raise StateMismatchError(f"{path}: {error}") from error
    return iterator


def _every_shard(directory: epath.Path, iterator: Any, index: int, count: int) -> list[dict[str, Any]] | None:
    """Every old process's state, when the checkpoint was written by another number of
    processes and ``iterator`` restores from them all; else None (the one-file rule)."""
    if iterator is None or not takes_every_host(iterator):
        return None
    directory = epath.Path(directory)
    if (directory / state_filename(index, count)).exists():
        return None
    found = _existing_states(directory)
    counts = {c for _, c in found}
    if len(counts) != 1:
        return None
    (old,) = counts
    if old == count or any((k, old) not in found for k in range(old)):
        return None
    states = [_read_state_file(found[k, old]) for k in range(old)]
    return None if any(grain_state.is_grain_state(s) for s in states) else states


def _restore_item(directory: Any, iterator: Any, index: int, count: int) -> Any:
    """Restores ``iterator`` from this process's file, or from every old process's
    (:func:`_every_shard`); returns what :func:`_restore_from` returns."""
    states = _every_shard(epath.Path(directory), iterator, index, count)
    if states is None:
        return _restore_from(find_state_file(epath.Path(directory), index, count), iterator)
    try:
        iterator.set_state(states)
    except StateMismatchError as error:
        raise StateMismatchError(f"{directory} (the states of all {len(states)} processes): {error}") from error
    return iterator


def _process() -> tuple[int, int]:
    return jax.process_index(), jax.process_count()


def v1_save(iterator: Any, directory: Any) -> Coroutine[Any, Any, None]:
    """Orbax v1's ``StatefulCheckpointable.save`` for ``iterator``, as Grain's is.

    The state is taken now, so the training loop may go on while Orbax runs the
    returned coroutine (not yet awaited) in its background thread. That coroutine waits
    for Orbax to create ``directory`` (a ``PathAwaitingCreation``) and writes this
    process's ``process_<i>-of-<n>.json``, the state as indented JSON (Grain's files).
    It writes a temporary file and renames it, so a failed write leaves no state file
    behind.

    Raises:
        TypeError: the iterator's state is not JSON-able (raised here, before Orbax
            creates anything).
    """
    text = _state_text(iterator, indent=4)
    index, count = _process()

    async def write() -> None:
        path = await directory.await_creation()
        target = epath.Path(path) / state_filename(index, count)
        temporary = target.parent / f".{target.name}.partial"
        try:
            await asyncio.to_thread(temporary.write_text, text)
            await asyncio.to_thread(temporary.replace, target)
        except BaseException:
            if temporary.exists():
                temporary.unlink()
            raise

    return write()


def v1_load(iterator: Any, directory: Any) -> Coroutine[Any, Any, None]:
    """Orbax v1's ``StatefulCheckpointable.load`` for ``iterator``, as Grain's is.

    Returns a coroutine (not yet awaited) that Orbax runs in its background thread: it
    reads this process's file (process 0's on another process count, see the module
    docstring) and sets the iterator to it, converting a state Grain wrote where that is
    exact, as :class:`CheckpointRestore` does.

    The coroutine raises:
        FileNotFoundError: the checkpoint holds no state for this process.
        ValueError: its state file is damaged (the message names it and what to do).
        StateMismatchError: the state does not fit the iterator.
    """
    index, count = _process()

    async def read() -> None:
        await asyncio.to_thread(_restore_item, directory, iterator, index, count)

    return read()


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
            ValueError: its state file is damaged (the message names it and what to do).
        """
        return _restore_item(directory, None if args is None else args.item, *_process())

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


def _item(item: Any, args: Any, method: str) -> Any:
    """Grain's rule: the ``item`` argument (older Orbax API), else ``args.item``."""
    if item is None and args is not None:
        item = getattr(args, "item", None)
    if item is None and method == "save":
        raise ValueError(
            "PyGrainCheckpointHandler.save needs the iterator: pass "
            "args=PyGrainCheckpointSave(iterator) (or item=iterator)"
        )
    if item is not None:
        _check_iterator(item, f"PyGrainCheckpointHandler.{method}")
    return item


class PyGrainCheckpointHandler(ocp.CheckpointHandler):
    """Grain's Orbax handler, by name and contract, writing granary's states.

    Orbax finds it through :class:`PyGrainCheckpointSave` and
    :class:`PyGrainCheckpointRestore`. Unlike :class:`IteratorCheckpointHandler` it is
    synchronous, as Grain's is: ``save`` takes the state and writes the file when Orbax
    calls it (still in ``mngr.save``, before the background commit), so a subclass that
    overrides ``save`` and ``restore`` and calls ``super()`` (MaxText's
    ``GrainCheckpointHandler``) sees every call. Both take ``item`` (the older Orbax
    API) or ``args``, and the directory as Orbax gives it.

    Files are Grain's: ``process_<i>-of-<n>.json`` with the state as indented JSON. A
    restore on another process count reads process 0's file (see the module
    docstring); a state written by Grain's own ``DataLoader`` is converted where the
    continuation is exact, else refused with :class:`~dataloader.StateMismatchError`.

    Example:
        >>> mngr.save(step, args=ocp.args.Composite(        # doctest: +SKIP
        ...     iter=dl.PyGrainCheckpointSave(iterator)))
        >>> mngr.restore(step, args=ocp.args.Composite(     # doctest: +SKIP
        ...     iter=dl.PyGrainCheckpointRestore(iterator)))
    """

    def save(self, directory: epath.Path, item: Any = None, args: Any = None) -> None:
        """Writes the iterator's state now to this process's file in ``directory``.

        Raises:
            ValueError: neither ``item`` nor ``args.item`` is given.
            TypeError: the item has no ``get_state()`` (or its state is not JSON-able).
        """
        item = _item(item, args, "save")
        path = epath.Path(directory) / state_filename(jax.process_index(), jax.process_count())
        path.write_text(_state_text(item, indent=4))

    def restore(self, directory: epath.Path, item: Any = None, args: Any = None) -> Any:
        """Moves the iterator to the saved state and returns it (the state dict when no
        iterator is given). Starts its prefetch, as Grain's does, so the first batches
        are computed while the model restores.

        Raises:
            ValueError: the checkpoint holds no state for this process (Grain raises a
                ``ValueError`` there too; the message lists what it holds), or its state
                file is damaged (the message names it and what to do).
            StateMismatchError: the state does not fit the iterator.
        """
        item = _item(item, args, "restore")
        try:
            restored = _restore_item(directory, item, *_process())
        except FileNotFoundError as error:
            raise ValueError(str(error)) from None
        start = getattr(item, "start_prefetch", None)
        if item is not None and callable(start):
            start()
        return restored

    def structure(self, directory: epath.Path) -> Any:
        """None: iterator states have no tree structure (Grain's answer)."""
        del directory
        return None

    def metadata(self, directory: epath.Path) -> Any:
        """None, as Grain's handler answers."""
        del directory
        return None

    def finalize(self, directory: epath.Path) -> None:
        del directory

    def close(self) -> None:
        pass


@ocp.args.register_with_handler(PyGrainCheckpointHandler, for_save=True)
@dataclasses.dataclass
class PyGrainCheckpointSave(ocp.args.CheckpointArgs):
    """Grain's save args: ``item`` is the iterator whose state ``save`` writes.

    As in Grain, the state is read when the handler's ``save`` runs (inside
    ``mngr.save``), not when this object is made.

    Example:
        >>> mngr.save(step, args=ocp.args.Composite(        # doctest: +SKIP
        ...     params=ocp.args.StandardSave(params), iter=dl.PyGrainCheckpointSave(it)))
    """

    item: Any


@ocp.args.register_with_handler(PyGrainCheckpointHandler, for_restore=True)
@dataclasses.dataclass
class PyGrainCheckpointRestore(ocp.args.CheckpointArgs):
    """Grain's restore args: ``item`` is the iterator to move to the saved state (None:
    the restore returns the saved state dict instead).

    Example:
        >>> mngr.restore(step, args=ocp.args.Composite(     # doctest: +SKIP
        ...     iter=dl.PyGrainCheckpointRestore(it)))
    """

    item: Any
