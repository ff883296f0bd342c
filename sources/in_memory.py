"""Sources held in memory: a range of integers and any Python sequence.

:class:`InMemoryDataSource` is also the test double of the package: it has the
full source surface (``__len__``, ``__getitem__``, ``__getitems__``, a stable
``repr``, pickling) over a plain list.
"""

from __future__ import annotations

import errno
import operator
import threading
from collections.abc import Mapping, Sequence
from typing import Any, SupportsIndex

import numpy as np

from ._indexing import as_index_array, check_index

_SHARING = threading.Lock()


def _shareable(elements: Any) -> bool:
    """Whether ``elements`` is an array the source shares with workers (see its class):
    a plain or memory-mapped numpy array of at least ``SHARE_BYTES`` without Python
    objects (a masked array or a matrix is pickled as it is: a copy of its data alone
    would lose what it adds)."""
    return (
        type(elements) in (np.ndarray, np.memmap)
        and elements.ndim >= 1
        and not elements.dtype.hasobject
        and elements.nbytes >= InMemoryDataSource.SHARE_BYTES
    )


class _Closed:
    """The elements of a source whose shared records ``close()`` freed: the length is
    kept, a read says so."""

    def __init__(self, length: int) -> None:
        self._length = length

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: Any) -> Any:
        raise ValueError(
            "this InMemoryDataSource was closed: close() freed the shared memory its records "
            "were held in; read from a source that is open"
        )


class RangeDataSource:
    """The integers of ``range(start, stop, step)`` as a data source.

    Records are Python ints. Useful for index-only pipelines and tests, where
    the record is its own index.

    Args:
        start: First value, or the stop value when ``stop`` is omitted.
        stop: One past the last value (as for ``range``).
        step: Distance between values; not zero.

    Raises:
        TypeError: An argument is not an integer.
        ValueError: ``step`` is zero.

    Example:
        >>> source = RangeDataSource(10, 20, 2)
        >>> len(source), source[1], source.__getitems__([4, 0])
        (5, 12, [18, 10])
    """

    def __init__(self, start: int, stop: int | None = None, step: int = 1) -> None:
        if stop is None:
            start, stop = 0, start
        values = {"start": start, "stop": stop, "step": step}
        for name, value in values.items():
            if isinstance(value, bool) or not hasattr(value, "__index__"):
                raise TypeError(
                    f"RangeDataSource {name} must be an integer, got "
                    f"{type(value).__name__} {value!r}"
                )
        if operator.index(step) == 0:
            raise ValueError("RangeDataSource step must not be zero, got 0; pass step=1")
        self._range = range(operator.index(start), operator.index(stop), operator.index(step))

    @property
    def start(self) -> int:
        return self._range.start

    @property
    def stop(self) -> int:
        return self._range.stop

    @property
    def step(self) -> int:
        return self._range.step

    def __len__(self) -> int:
        return len(self._range)

    def __getitem__(self, index: SupportsIndex) -> int:
        return self._range[check_index(index, len(self._range))]

    def __getitems__(self, indices: Sequence[int] | np.ndarray) -> list[int]:
        """Returns the values at ``indices`` in the order given."""
        array = as_index_array(indices, len(self._range))
        # Python ints have no overflow, so compute in Python for huge ranges.
        return [self._range.start + i * self._range.step for i in array.tolist()]

    def __repr__(self) -> str:
        return f"RangeDataSource(start={self.start}, stop={self.stop}, step={self.step})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RangeDataSource):
            return NotImplemented
        return self._range == other._range

    def __hash__(self) -> int:
        return hash(self._range)


class InMemoryDataSource:
    """A data source over a sequence held in memory.

    Anything with ``__len__`` and integer ``__getitem__`` works (a list, a tuple, a numpy
    array). The ``repr`` names the type and length of the sequence, never its elements,
    so it stays short and the same in every process.

    What it costs with worker processes. Workers are started by a fork server, a fresh
    interpreter, not forked from the training process: they cannot inherit its memory.
    So the first time the source is pickled for them (when a ``DataLoader`` with workers
    is built), a numpy array of :attr:`SHARE_BYTES` or more (without Python objects) is
    copied into memory without a name (a ``memfd``) that the training process and every
    worker map read-only; from then on the source reads that copy, and lets go of the
    array it was given. So:

    * handed over (the caller keeps no other reference:
      ``InMemoryDataSource(np.load(path))``, or ``del array`` after building the source),
      the array is held **once** for the whole process tree, whatever the number of
      workers (while the copy is made, the original and the copy both exist);
    * kept by the caller as well, the tree holds it **twice**: the caller's array and
      the shared copy (which do not change together: the source reads the copy);
    * with ``worker_count=0`` nothing is copied: the source reads the array it was given.

    The shared copy is bounded by memory, not by ``/dev/shm``'s size (see
    :mod:`._array_block`). Do not mutate a sequence while a loader reads it; once shared,
    records are read-only views. Smaller arrays and other sequences are pickled into each
    worker as they are.

    Grain's ``InMemoryDataSource`` (``grain.python``'s name for its
    ``SharedMemoryDataSource``) is this class: it takes the same arguments, and
    ``close()``/``unlink()``. With ``name`` the records live in a named
    :class:`SharedMemoryDataSource` block (numbers and other small picklable
    records included), which other processes can read by that name.

    Args:
        elements: The records. ``None`` with a ``name``: read the block of that name.
        name: Store ``elements`` in a shared-memory block of this name, or with
            ``elements=None`` read the block of this name.

    Raises:
        TypeError: ``elements`` is a mapping, an iterator or has no length.
        ValueError, FileExistsError, FileNotFoundError: see :class:`SharedMemoryDataSource`
            (with ``name``).

    Example:
        >>> source = InMemoryDataSource(["a", "b", "c"])
        >>> source[2], source.__getitems__([1, 1, 0]), repr(source)
        ('c', ['b', 'b', 'a'], 'InMemoryDataSource(<list of 3 elements>)')
    """

    def __init__(self, elements: Sequence[Any] | None = None, *, name: str | None = None) -> None:
        if name is not None:
            from .shared_memory import SharedMemoryDataSource

            shared = SharedMemoryDataSource(elements, name=name)
            if elements is not None:
                self._shared = shared  # made here: removed with this source
            self._elements: Any = shared  # a sequence in all but type: len and indexing
            return
        if elements is None:
            raise TypeError(
                "InMemoryDataSource needs elements, a sequence of records; pass "
                "InMemoryDataSource([...]), or name='...' to read a shared-memory block"
            )
        if isinstance(elements, Mapping):
            raise TypeError(
                f"InMemoryDataSource needs a sequence indexed by position, got a "
                f"{type(elements).__name__}; pass list(mapping.values()) or a list of items"
            )
        if not (hasattr(elements, "__len__") and hasattr(elements, "__getitem__")):
            raise TypeError(
                f"InMemoryDataSource needs a sequence with __len__ and __getitem__, got "
                f"{type(elements).__name__}; materialise it first, e.g. list(elements)"
            )
        self._elements = elements

    @property
    def elements(self) -> Sequence[Any]:
        """The sequence this source reads from."""
        return self._elements

    def __len__(self) -> int:
        return len(self._elements)

    def __getitem__(self, index: SupportsIndex) -> Any:
        return self._elements[check_index(index, len(self._elements))]

    def __getitems__(self, indices: Sequence[int] | np.ndarray) -> list[Any]:
        """Returns the elements at ``indices`` in the order given."""
        elements = self._elements
        return [elements[i] for i in as_index_array(indices, len(elements)).tolist()]

    # Arrays at least this large are shared with worker processes, held once for the tree.
    SHARE_BYTES = 1 << 20

    def __getstate__(self) -> dict[str, Any]:
        """A large numpy array goes to other processes once, through shared memory.

        The first pickling copies it into an :class:`~._array_block.ArrayBlock` (where
        ``memfd`` is refused, a :class:`SharedMemoryDataSource`), which this source reads
        from then on instead of the array it was given: see the class docstring for what
        that costs. Other elements are pickled as they are.
        """
        if _shareable(self._elements) and "_held" not in self.__dict__:
            with _SHARING:  # two threads pickling at once make one block
                if _shareable(self._elements) and "_held" not in self.__dict__:
                    self._share()
        held = self.__dict__.get("_held")
        return {"_elements": self._elements} if held is None else {"_held": held}

    def _share(self) -> None:
        """Moves the elements into memory shared with other processes, letting go of the
        array given."""
        from ._array_block import ArrayBlock

        try:
            held = ArrayBlock(self._elements)
        except OSError as exc:
            if exc.errno not in (errno.ENOSYS, errno.EPERM, errno.EACCES, errno.EINVAL):
                raise  # memory ran out: the error names the size
            # No memfd here (an old kernel, a seccomp filter): a named /dev/shm block,
            # which pickles itself by name.
            from .shared_memory import SharedMemoryDataSource

            self._elements = self._shared = SharedMemoryDataSource(self._elements)
            return
        self._held, self._elements = held, held.array

    def __setstate__(self, state: dict[str, Any]) -> None:
        held = state.get("_held")
        if held is None:
            self._elements = state["_elements"]
        else:
            self._held, self._elements = held, held.array

    def _blocks(self) -> list[Any]:
        """The shared-memory sources behind this one (made here, or read by name)."""
        from .shared_memory import SharedMemoryDataSource

        blocks: list[Any] = []
        for block in (self.__dict__.get("_shared"), self._elements):
            if isinstance(block, SharedMemoryDataSource) and all(block is not b for b in blocks):
                blocks.append(block)
        return blocks

    def close(self) -> None:
        """Frees what this process holds in shared memory (Grain's ``close``).

        A block this source made (with ``name``, or to share a large array with worker
        processes) is removed, and reading it afterwards is an error; a given sequence
        the source still reads stays readable.
        """
        for block in self._blocks():
            block.close()
        self.__dict__.pop("_shared", None)
        held = self.__dict__.pop("_held", None)
        if held is not None:
            held.close()
            self._elements = _Closed(len(self._elements))

    def unlink(self) -> None:
        """Removes the name of the shared-memory block behind this source (Grain's ``unlink``)."""
        for block in self._blocks():
            block.unlink()

    def __repr__(self) -> str:
        return f"InMemoryDataSource(<{type(self._elements).__name__} of {len(self)} elements>)"

    def __str__(self) -> str:
        # Grain's text for records in a shared-memory block; the repr otherwise.
        blocks = self._blocks()
        return str(self._elements) if any(b is self._elements for b in blocks) else repr(self)
