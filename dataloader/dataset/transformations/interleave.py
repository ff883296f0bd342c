"""Grain's ``InterleaveIterDataset``: several datasets read ``cycle_length`` at a time.

The way to read sources without random access (Parquet, TFRecord, one stream per
file) with some mixing, as MaxText does::

    files = dl.MapDataset.source(paths).seed(0).shuffle().repeat(epochs)  # file order per epoch
    rows = dl.experimental.InterleaveIterDataset(files.map(dl.experimental.ParquetIterDataset),
                                                 cycle_length=4)

``datasets`` is a sequence of ``IterDataset`` or ``MapDataset`` (a ``MapDataset`` is read
as ``to_iter_dataset()``), or a ``MapDataset`` whose elements are datasets (computed when
their turn to open comes). The order, the state and the restore are those of
:class:`~dataloader.engine.stages.interleave.InterleaveDatasetIterator`.

Where it runs: in the consumer's process (or, under ``mp_prefetch``, in its thread), as
every iterator-level stage. Its output never depends on the number of workers: Grain
instead gives each worker process a slice of ``datasets``, which changes the order with
``num_workers``. The datasets being interleaved run as they were built: an
engine-backed one with its own ``mp_prefetch`` has its own workers.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from typing import Any

from dataloader.dataset.base import DatasetIterator, IterDataset
from dataloader.dataset.map_dataset import MapDataset
from dataloader.dataset.transformations.apply import get_next_index, set_next_index
from dataloader.dataset.transformations.prefetch import ThreadPrefetchDatasetIterator
from dataloader.engine.stages.interleave import InterleaveDatasetIterator
from dataloader.options import check_int

# Every open dataset holds files and buffers; a cycle this long is a mistake (typically
# cycle_length=len(ds) over a dataset repeated for ever), not a plan.
MAX_CYCLE_LENGTH = 4096


class InterleaveIterDataset(IterDataset):
    """Interleaves ``datasets``, ``cycle_length`` of them open at a time, round-robin.

    Args:
        datasets: ``IterDataset``/``MapDataset`` objects, or a ``MapDataset`` of them.
        cycle_length: how many datasets are read at a time (1: one after another).
        num_make_iter_threads: threads that open the next datasets ahead (0: none).
        make_iter_buffer_size: how many datasets to keep opened ahead.
        iter_buffer_size: elements each open ``IterDataset`` computes ahead in a thread
            of its own. 0 by default (Grain: 1): handing every element from a thread to
            the consumer took the MaxText Parquet path from ~110k to ~9.5k rows/s here,
            and the file sources and engine-backed streams read ahead by themselves.
            Worth it for a dataset of your own that waits on I/O.

    Raises:
        ValueError: ``cycle_length`` is not a positive integer, or opens more than
            4096 datasets at once; a buffer or thread count is negative.
        TypeError: an element of a sequence ``datasets`` is not a dataset.

    Example:
        >>> import dataloader as dl
        >>> parts = [dl.MapDataset.source(p).to_iter_dataset() for p in ([1, 2, 3], [4], [5, 6])]
        >>> list(dl.experimental.InterleaveIterDataset(parts, cycle_length=2))
        [1, 4, 2, 5, 3, 6]
    """

    def __init__(
        self,
        datasets: Sequence[IterDataset | MapDataset] | MapDataset,
        *,
        cycle_length: int,
        num_make_iter_threads: int = 1,
        make_iter_buffer_size: int = 1,
        iter_buffer_size: int = 0,
    ) -> None:
        # Not passed as parents: a MapDataset of datasets is computed lazily, one by one.
        super().__init__()
        if isinstance(datasets, MapDataset):
            self._datasets: Any = datasets
        elif isinstance(datasets, Sequence) and not isinstance(datasets, (str, bytes)):
            self._datasets = list(datasets)
            for i, ds in enumerate(self._datasets):
                _check_dataset(ds, i)
        else:
            raise TypeError(
                f"InterleaveIterDataset needs a sequence of datasets or a MapDataset of "
                f"datasets, got {datasets!r}"
            )
        if isinstance(cycle_length, bool) or not isinstance(cycle_length, int) or cycle_length < 1:
            raise ValueError(
                f"cycle_length must be a positive integer (how many datasets to read at a "
                f"time), got {cycle_length!r}"
            )
        self.cycle_length = cycle_length
        if min(cycle_length, len(self._datasets)) > MAX_CYCLE_LENGTH:
            endless = len(self._datasets) == sys.maxsize
            raise ValueError(
                f"cycle_length={cycle_length} would keep {min(cycle_length, len(self._datasets))} "
                f"datasets open at once (at most {MAX_CYCLE_LENGTH})"
                + ("; datasets is repeated for ever, so pass a cycle_length rather than "
                   "len(datasets)" if endless else "; pass a smaller cycle_length")
            )
        self.num_make_iter_threads = check_int("num_make_iter_threads", num_make_iter_threads, 0)
        self.make_iter_buffer_size = check_int("make_iter_buffer_size", make_iter_buffer_size, 0)
        self.iter_buffer_size = check_int("iter_buffer_size", iter_buffer_size, 0)

    def __iter__(self) -> DatasetIterator:
        return _InterleaveIterator(
            functools.partial(_open, self._datasets, self.iter_buffer_size),
            len(self._datasets),
            self.cycle_length,
            self.num_make_iter_threads,
            self.make_iter_buffer_size,
        )

    def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
        """Keeps ``datasets[sl]`` (Grain's hook for sharding a dataset in place)."""
        del sequential_slice  # the datasets are sliced either way, as in Grain
        self._datasets = self._datasets[sl]

    def __repr__(self) -> str:
        return f"InterleaveIterDataset([{len(self._datasets)} datasets], cycle_length={self.cycle_length})"


class _InterleaveIterator(InterleaveDatasetIterator):
    """The interleave's iterator, with Grain's next index where Grain has one: over a
    single dataset it is that dataset's (with several, an element's index in the
    interleaved stream says nothing about where each dataset stands)."""

    def _single(self, what: str) -> None:
        if self._count != 1:
            raise NotImplementedError(
                f"{what} is not supported for InterleaveDatasetIterator with more than one "
                f"dataset (this one interleaves {self._count}); save and restore with "
                f"get_state/set_state"
            )

    def _get_next_index(self) -> int:
        self._single("get_next_index")
        it = self._slots[0]
        if it is None:  # not opened yet, or ended
            return 0 if self._ended[0] is None else get_next_index(self._reopened())
        return get_next_index(it)

    def _set_next_index(self, index: int) -> None:
        self._single("set_next_index")
        it = self._slots[0] or self._reopened()
        set_next_index(it, index)

    def _reopened(self) -> DatasetIterator:
        """The iterator of the single dataset in slot 0, opened (where it ended, if it did)."""
        it = self._opener(0)
        if self._ended[0] is not None:
            it.set_state(self._ended[0])
        self._slots[0], self._indices[0], self._ended[0] = it, 0, None
        self._opened = 1
        return it


def _open(datasets: Any, iter_buffer_size: int, index: int) -> DatasetIterator:
    """The iterator of ``datasets[index]``, read ahead in a thread if asked to."""
    ds = datasets[index]
    _check_dataset(ds, index)
    if isinstance(ds, MapDataset):
        return iter(ds.to_iter_dataset())
    it = iter(ds)
    if iter_buffer_size and not isinstance(it, ThreadPrefetchDatasetIterator):
        return ThreadPrefetchDatasetIterator(it, iter_buffer_size)
    return it


def _check_dataset(ds: Any, index: int) -> None:
    if not isinstance(ds, (IterDataset, MapDataset)):
        raise TypeError(
            f"InterleaveIterDataset: dataset {index} is {ds!r}, expected an IterDataset or a "
            f"MapDataset (e.g. map file names to ParquetIterDataset)"
        )
