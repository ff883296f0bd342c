"""The data-source protocol and the one function the loader reads through."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Protocol, SupportsIndex, TypeVar, runtime_checkable

import numpy as np

T_co = TypeVar("T_co", covariant=True)


@runtime_checkable
class RandomAccessDataSource(Protocol[T_co]):
    """Anything with ``__len__`` and ``__getitem__`` that the loader can read.

    A list, a ``numpy`` array or any user class with these two methods is a
    data source. To behave well inside the loader a source must also honour
    these obligations, which the protocol cannot check:

    * **Deterministic.** ``source[i]`` returns the same record every time, in
      every process, for the life of a training run. The loader's guarantee
      that batches are a pure function of the configuration rests on it.
    * **Thread-safe reads.** ``__getitem__`` (and ``__getitems__``) may be
      called from several threads at once.
    * **Picklable, opened lazily.** The source is pickled into each worker
      process. Open file handles in the process that reads (remember the pid
      and reopen after a fork or unpickling) and drop them in
      ``__getstate__``.
    * **A stable ``repr``.** Equal sources print equal reprs in every process
      (no addresses, no element dumps), because the repr identifies the
      source in checkpoints and error messages.
    * **Integer indices.** Indices are Python or numpy integers in
      ``[0, len(source))``; out-of-range indices raise ``IndexError``.
    * **Optional batched reads.** ``__getitems__(indices) -> list`` returns the
      records of ``indices`` (a list of ints or a 1-D integer array, unsorted,
      possibly with duplicates) in the order given. Define it when reading
      many records at once is cheaper than reading them one by one; the
      loader calls it once per work unit through :func:`read_records`.
    * **Optional record locations.** ``record_location(index) -> str`` says
      where a record lives (for a file-backed source: the file and the
      record's place in it). When a read fails, the loader reads the unit's
      records one by one and names the failing record with this text.

    Example:
        >>> isinstance([b"a", b"b"], RandomAccessDataSource)
        True
    """

    def __len__(self) -> int:
        """Returns the number of records."""
        ...

    def __getitem__(self, index: SupportsIndex) -> T_co:
        """Returns the record at ``index``."""
        ...


@runtime_checkable
class HintedDataSource(Protocol):
    """A source that can start fetching records before they are read (a remote one).

    The loader tells it which records the coming work units will read, so their bytes
    travel while the current unit is computed. ``takes_hints`` says whether a hint does
    anything: where it is False (local files, which the page cache serves) the loader
    does not even compute the coming records' indices, which costs a permutation call
    per unit. ``prefetch`` must return at once and never fail a read: a failed fetch is
    the later read's to report, at its record.

    Example:
        >>> class Remote:
        ...     takes_hints = True
        ...     def prefetch(self, indices): print("fetching", list(indices))
        >>> isinstance(Remote(), HintedDataSource), isinstance(["a", "b"], HintedDataSource)
        (True, False)
    """

    @property
    def takes_hints(self) -> bool:
        """Whether :meth:`prefetch` does anything for this source."""
        ...

    def prefetch(self, indices: Sequence[int] | np.ndarray) -> None:
        """Starts fetching the records at ``indices`` (never blocks for long)."""
        ...


def read_records(source: RandomAccessDataSource, indices: Sequence[int] | np.ndarray) -> list:
    """Reads the records at ``indices`` from ``source``, in the order given.

    Uses ``source.__getitems__`` when the source defines it, else one
    ``source[i]`` per index.

    Args:
        source: The data source.
        indices: A list of ints or a 1-D numpy integer array (the loader passes
            int64 arrays). Duplicates and any order are allowed.

    Returns:
        A list with one record per index.

    Raises:
        ValueError: ``__getitems__`` returned a different number of records.

    Example:
        >>> read_records(["a", "b", "c"], [2, 0, 2])
        ['c', 'a', 'c']
    """
    getitems = getattr(source, "__getitems__", None)
    if getitems is None:
        if isinstance(indices, np.ndarray):
            indices = indices.tolist()
        # operator.index, unlike int, refuses 1.5 instead of reading record 1.
        return [source[operator.index(i)] for i in indices]
    records = getitems(indices)
    if not isinstance(records, list):
        records = list(records)
    if len(records) != len(indices):
        raise ValueError(
            f"{source!r}.__getitems__ returned {len(records)} records for "
            f"{len(indices)} indices; it must return exactly one record per index"
        )
    return records
