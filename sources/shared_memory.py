"""Records held once in shared memory for a whole process tree.

A source held in memory is pickled into every worker process, so a 400 MB array read
by 2 workers used to cost the tree three copies (and more while pickling). Here the
records are written once into a named block of ``/dev/shm``; pickling sends the name and
the layout, and every process maps the block read-only: the tree pays for the data
once, whatever the number of workers, and reading a record copies nothing (arrays are
read-only views).

What can be shared (what records are):

* a numpy array: record ``i`` is ``array[i]`` (a read-only view);
* a dict of numpy arrays of one length (columns): record ``i`` is ``{name: column[i]}``;
* a sequence of ``bytes`` or ``str``: record ``i`` is the ``bytes`` (a copy of the
  record's bytes) or ``str``;
* a sequence of numpy arrays of one dtype (ragged shapes allowed): record ``i`` is the
  array (a read-only view).

The block is named ``granary_<pid>_src_<token>`` after the process that made it, which
unlinks it when the source is garbage collected or at exit; a new worker pool sweeps
blocks of processes that died (see :mod:`dataloader.engine.pool.shm`). Workers that
still map an unlinked block keep reading it.
"""

from __future__ import annotations

import contextlib
import mmap
import operator
import os
import weakref
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, SupportsIndex

import numpy as np

from ._indexing import as_index_array, check_index

SHM_DIR = "/dev/shm"
# Every block of this project is named PREFIX<pid of its maker>_..., which is how a new
# pool knows whose blocks are left over (dataloader.engine.pool.shm.sweep_stale_blocks).
PREFIX = "granary_"
ALIGN = 64


def round_up(n: int, to: int = ALIGN) -> int:
    return (n + to - 1) // to * to


def create_block(name: str, size: int) -> mmap.mmap:
    """Creates ``/dev/shm/<name>`` (which must not exist) of ``size`` bytes and maps it.

    The space is reserved up front (``posix_fallocate``), so a full ``/dev/shm`` fails
    here, not as a ``SIGBUS`` when the mapping is written; on failure nothing is left.
    """
    path = os.path.join(SHM_DIR, name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.posix_fallocate(fd, 0, size)
        return mmap.mmap(fd, size)
    except BaseException:
        _unlink(path)
        raise
    finally:
        os.close(fd)


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


class _Pieces(NamedTuple):
    """A part stored as the concatenation of ``pieces`` (written one after another into
    the block, never joined in memory first): ``items`` items of ``dtype``."""

    dtype: np.dtype
    items: int
    pieces: list[Any]  # bytes or numpy arrays of ``dtype``


def _layout_of(elements: Any) -> tuple[str, list[tuple[str, np.ndarray | _Pieces]], int]:
    """``(kind, [(part name, what to store)], length)`` for what ``elements`` is."""
    if isinstance(elements, np.ndarray):
        if elements.ndim == 0 or elements.dtype == object:
            raise TypeError(
                f"SharedMemoryDataSource needs an array of records along axis 0 with a "
                f"numeric dtype, got shape {elements.shape} dtype {elements.dtype}"
            )
        return "array", [("data", np.ascontiguousarray(elements))], len(elements)
    if isinstance(elements, Mapping):
        columns = {str(k): np.asarray(v) for k, v in elements.items()}
        lengths = {k: (len(v) if v.ndim else None) for k, v in columns.items()}
        if not columns or None in lengths.values() or len(set(lengths.values())) != 1:
            raise ValueError(f"a dict of columns needs arrays of one length, got lengths {lengths}")
        bad = [k for k, v in columns.items() if v.dtype == object]
        if bad:
            raise TypeError(f"columns {bad} hold Python objects; SharedMemoryDataSource shares numeric arrays")
        length = len(next(iter(columns.values())))
        return "columns", [(k, np.ascontiguousarray(v)) for k, v in columns.items()], length
    if not isinstance(elements, Sequence) or isinstance(elements, (str, bytes)):
        raise TypeError(
            f"SharedMemoryDataSource takes a numpy array, a dict of arrays, or a sequence of "
            f"bytes, str or arrays; got {type(elements).__name__}"
        )
    if not len(elements):
        raise ValueError("SharedMemoryDataSource got no records; pass at least one")
    first = elements[0]
    if isinstance(first, (bytes, str)):
        kind = "bytes" if isinstance(first, bytes) else "str"
        wrong = next((i for i, e in enumerate(elements) if type(e) is not type(first)), None)
        if wrong is not None:
            raise TypeError(f"record {wrong} is {type(elements[wrong]).__name__}, record 0 is {kind}; use one type")
        blobs = [e.encode() for e in elements] if kind == "str" else list(elements)
        offsets = np.zeros(len(blobs) + 1, np.int64)
        np.cumsum([len(b) for b in blobs], out=offsets[1:])
        data = _Pieces(np.dtype(np.uint8), int(offsets[-1]), blobs)
        return kind, [("offsets", offsets), ("data", data)], len(blobs)
    if isinstance(first, np.ndarray):
        arrays = [np.asarray(e) for e in elements]
        if any(a.dtype != first.dtype or a.ndim != first.ndim or a.ndim == 0 for a in arrays):
            raise TypeError("a sequence of arrays needs one dtype and one number of dimensions (>= 1)")
        shapes = np.asarray([a.shape for a in arrays], np.int64)
        offsets = np.zeros(len(arrays) + 1, np.int64)
        np.cumsum([a.size for a in arrays], out=offsets[1:])
        data = _Pieces(first.dtype, int(offsets[-1]), arrays)
        return "arrays", [("shapes", shapes), ("offsets", offsets), ("data", data)], len(arrays)
    raise TypeError(
        f"records of type {type(first).__name__} cannot be shared without a copy per process; "
        f"convert them to arrays or bytes, or use InMemoryDataSource"
    )


def _write(dest: np.ndarray, start: int, part: np.ndarray | _Pieces) -> None:
    """Writes ``part``'s bytes into ``dest`` (the block as uint8) from ``start``."""
    # A memoryview slice takes bytes as they are: no numpy view made per record.
    view = dest.data
    for piece in part.pieces if isinstance(part, _Pieces) else [part]:
        raw = piece if isinstance(piece, bytes) else np.ascontiguousarray(piece).reshape(-1).view(np.uint8).data
        view[start : start + len(raw)] = raw
        start += len(raw)


class SharedMemoryDataSource:
    """An in-memory source stored once in shared memory (see the module docstring).

    Args:
        elements: a numpy array, a dict of columns, or a sequence of bytes, str or arrays.

    Raises:
        TypeError, ValueError: naming what cannot be shared and what to do.

    Example:
        >>> source = SharedMemoryDataSource(np.arange(12).reshape(4, 3))
        >>> source[2].tolist(), len(source)
        ([6, 7, 8], 4)
    """

    def __init__(self, elements: Any) -> None:
        kind, parts, length = _layout_of(elements)
        layout, offset = [], 0
        for name, part in parts:
            if isinstance(part, _Pieces):
                dtype, shape, nbytes = part.dtype, (part.items,), part.items * part.dtype.itemsize
            else:
                dtype, shape, nbytes = part.dtype, part.shape, part.nbytes
            layout.append((name, dtype.str, shape, offset))
            offset = round_up(offset + nbytes)
        size = max(offset, 1)
        self._name = f"{PREFIX}{os.getpid()}_src_{os.urandom(4).hex()}"
        path = os.path.join(SHM_DIR, self._name)
        target = create_block(self._name, size)
        dest = np.frombuffer(target, np.uint8)  # written in place: no temporary copy
        try:
            for (_, _, _, start), (_, part) in zip(layout, parts):
                _write(dest, start, part)
        except BaseException:
            _unlink(path)
            raise
        finally:
            del dest  # the mapping closes only once no array views it
            target.close()
        self._finalizer = weakref.finalize(self, _unlink, path)
        self._kind, self._layout, self._length, self._size = kind, layout, length, size
        self._attach()

    @property
    def name(self) -> str:
        """The shared-memory block holding the records."""
        return self._name

    def _attach(self) -> None:
        fd = os.open(os.path.join(SHM_DIR, self._name), os.O_RDONLY)
        try:
            self._mmap = mmap.mmap(fd, self._size, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        base = np.frombuffer(self._mmap, np.uint8)
        self._parts = {}
        for name, dtype, shape, start in self._layout:
            count = int(np.prod(shape, dtype=np.int64))
            view = base[start : start + count * np.dtype(dtype).itemsize].view(dtype).reshape(shape)
            self._parts[name] = view

    def __getstate__(self) -> dict[str, Any]:
        # The name and the layout only: the receiving process maps the same block.
        return {k: self.__dict__[k] for k in ("_name", "_kind", "_layout", "_length", "_size")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        try:
            self._attach()
        except FileNotFoundError:
            raise FileNotFoundError(
                f"shared-memory block {self._name} of a SharedMemoryDataSource is gone: the "
                f"process that made it ended or dropped the source; keep the source alive "
                f"while workers read it"
            ) from None

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: SupportsIndex) -> Any:
        return self._record(check_index(operator.index(index), self._length))

    def __getitems__(self, indices: Sequence[int] | np.ndarray) -> list[Any]:
        return [self._record(i) for i in as_index_array(indices, self._length).tolist()]

    def _record(self, i: int) -> Any:
        parts, kind = self._parts, self._kind
        if kind == "array":
            return parts["data"][i]
        if kind == "columns":
            return {name: column[i] for name, column in parts.items()}
        start, stop = int(parts["offsets"][i]), int(parts["offsets"][i + 1])
        if kind == "bytes":
            return parts["data"][start:stop].tobytes()
        if kind == "str":
            return parts["data"][start:stop].tobytes().decode()
        return parts["data"][start:stop].reshape(tuple(parts["shapes"][i].tolist()))

    def __repr__(self) -> str:
        return f"SharedMemoryDataSource(<{self._kind} of {self._length} records, {self._size / 2**20:.1f} MiB>)"
