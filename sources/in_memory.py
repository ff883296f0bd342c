"""Sources held in memory: a range of integers and any Python sequence.

:class:`InMemoryDataSource` is also the test double of the package: it has the
full source surface (``__len__``, ``__getitem__``, ``__getitems__``, a stable
``repr``, pickling) over a plain list.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import Any, SupportsIndex

import numpy as np

from ._indexing import as_index_array, check_index


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

    The sequence is used as given, not copied: do not mutate it while a loader
    reads it, or the stream stops being deterministic. Anything with ``__len__``
    and integer ``__getitem__`` works (a list, a tuple, a numpy array).

    The ``repr`` names the type and length of the sequence, never its
    elements, so it stays short and the same in every process.

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

    # Arrays at least this large travel to worker processes through shared memory.
    SHARE_BYTES = 1 << 20

    def __getstate__(self) -> dict[str, Any]:
        """A large numpy array goes to other processes once, through shared memory.

        The first pickling places the array in a :class:`SharedMemoryDataSource` that this
        source keeps (and frees with itself); every process that unpickles the source maps
        that block read-only, so the process tree holds the array once whatever the
        number of workers. Other elements are pickled as they are.
        """
        elements = self._elements
        if (
            isinstance(elements, np.ndarray)
            and elements.ndim >= 1
            and elements.dtype != object
            and elements.nbytes >= self.SHARE_BYTES
        ):
            shared = self.__dict__.get("_shared")
            if shared is None:
                from .shared_memory import SharedMemoryDataSource

                shared = self.__dict__["_shared"] = SharedMemoryDataSource(elements)
            return {"_shared_source": shared}
        return {"_elements": elements}

    def __setstate__(self, state: dict[str, Any]) -> None:
        shared = state.get("_shared_source")
        if shared is None:
            self._elements = state["_elements"]
        else:
            self._elements = shared._parts["data"]  # a read-only view of the shared block
            self._shared = shared

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

        A block this source made (with ``name``, or to send a large array to worker
        processes) is removed; a given sequence stays readable, a named block does not.
        """
        for block in self._blocks():
            block.close()
        self.__dict__.pop("_shared", None)

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
