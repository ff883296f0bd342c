"""What the streaming file sources share: their paths, and reading several files.

A file source over one file is that file's stream. Over several it interleaves them
as Grain's file sources do: :data:`CYCLE_LENGTH` files open at a time, one element
from each in turn (``InterleaveIterDataset``), the next file opened when one ends. The
state is then the interleave's (which files are open, and where each one is).

Element-wise calls chained on a source whose format finds a record by position
(Parquet: :meth:`FileIterDataset._stream_form`) run on the engine, in worker processes under
``mp_prefetch``; the source alone, iterated, reads in order in this process.

To shuffle the files, or read them for several epochs, build the list as a
``MapDataset`` instead (``MapDataset.source(paths).seed(s).shuffle().repeat(n)``),
map it to one source per file and interleave that, as MaxText does.
"""

from __future__ import annotations

import abc
import copy
import os
from typing import TYPE_CHECKING, Any

from dataloader.dataset.base import DatasetIterator, IterDataset
from dataloader.engine.stages.base import expect_state
from dataloader.errors import StateMismatchError
from dataloader.sources import expand_paths

if TYPE_CHECKING:
    from dataloader.dataset.streams.lowering import StreamForm

CYCLE_LENGTH = 16
"""Files read at a time by a source over several files (Grain's number)."""


class FileIterDataset(IterDataset):
    """A source of records read in order from one or more files.

    Subclasses define :meth:`_file_iterator`, the stream of one file.

    Args:
        path: a path, a glob pattern, or a list of those (globs sorted).
        what, example_glob: the format's name and a file pattern, for messages.
        local: whether the paths are local files (checked and globbed here); paths on
            another file system are taken as given.
    """

    def __init__(self, path: Any, *, what: str, example_glob: str, local: bool = True) -> None:
        super().__init__()
        if local:
            self._paths = expand_paths(path, what=what, example_glob=example_glob)
        else:
            self._paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
            self._paths = [os.fspath(p) for p in self._paths]
            if not self._paths:
                raise ValueError(f"path is empty; pass at least one {what} file")

    @property
    def paths(self) -> list[str]:
        """The files, in the order they are opened."""
        return list(self._paths)

    @abc.abstractmethod
    def _file_iterator(self, path: str) -> DatasetIterator:
        """The stream of one file, from its start."""

    def _for_file(self, path: str) -> FileIterDataset:
        """This source over ``path`` alone (checked already, so not checked again)."""
        one = copy.copy(self)
        one._paths = [path]
        return one

    def __iter__(self) -> DatasetIterator:
        if len(self._paths) == 1:
            return self._file_iterator(self._paths[0])
        from dataloader.dataset.transformations.interleave import InterleaveIterDataset

        files = [self._for_file(p) for p in self._paths]
        return iter(InterleaveIterDataset(files, cycle_length=CYCLE_LENGTH))

    def _stream_form(self) -> StreamForm | None:
        """This stream as random access over its order (:mod:`~dataloader.dataset.
        streams.lowering`), or None for a format whose records cannot be found by
        position (then the calls chained on it run at the iterator level)."""
        return None

    def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
        """Keeps the files ``paths[sl]`` (Grain's hook for sharding a dataset in place);
        a slice of no file yields nothing."""
        del sequential_slice
        self._paths = self._paths[sl]

    def __repr__(self) -> str:
        shown = self._paths[0] if len(self._paths) == 1 else f"[{len(self._paths)} files]"
        return f"{type(self).__name__}({shown!r})"


def check_file_state(state: Any, path: str, keys: tuple[str, ...], what: str) -> dict[str, Any]:
    """``state`` if it is a state of ``what`` over the file ``path``, else a clear error.

    States name the file by its base name: data moved to another directory restores,
    a state of another file (a shuffled file list restored in another order) does not.
    """
    state = expect_state(state, keys, what)
    name = state.get("path")
    if name is not None and name != os.path.basename(path):
        raise StateMismatchError(
            f"this state was saved while reading the file {name!r}, not {os.path.basename(path)!r}; "
            f"restore with the files (and file order) the state was made for"
        )
    return state
