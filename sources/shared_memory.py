"""Records held once in shared memory for a whole process tree.

A source held in memory is pickled into every worker process, so a 400 MB array read
by 2 workers used to cost the tree three copies (and more while pickling). Here the
records are written once into a named block of ``/dev/shm``; pickling sends the name,
and every process maps the block read-only: the tree pays for the data once, whatever
the number of workers.

What can be stored (what records are):

* a numpy array: record ``i`` is ``array[i]`` (a read-only view);
* a dict of numpy arrays of one length (columns): record ``i`` is ``{name: column[i]}``;
* a sequence of ``bytes`` or of ``str``: record ``i`` is the ``bytes`` or ``str``;
* a sequence of numpy arrays of one dtype (ragged shapes allowed): record ``i`` is the
  array (a read-only view);
* a sequence of Python ``int`` (within int64), of ``float`` or of ``bool``: stored as
  one numpy array, records come back as the Python type they were;
* any other sequence of picklable objects (Grain's ``ShareableList`` takes ``None`` and
  mixed types, users pass dicts and tuples): each record is pickled into the block and
  unpickled on every read, so a reader gets its own copy.

The block starts with a header (magic bytes and the layout as JSON, written last), so
``SharedMemoryDataSource(name=...)`` attaches to a block by its name alone, as Grain's
does, in any process of the machine.

Who removes a block. The process that made it, once: when the source is closed, garbage
collected, or at exit; copies made by pickling or by attaching never do (``unlink()``
removes it by hand, as Grain's does). A maker killed by a signal removes nothing, so a
block may be left over; whether anyone still uses it is told by a lock, never by a pid
(pids are not unique across containers that share ``/dev/shm``, e.g. ``docker
--ipc=host``): every source, the maker and every reader (an attached or unpickled
copy, in any process or container), holds a shared ``flock`` on the block from before
it is written until the source is closed or collected, and the kernel drops it when the
process ends, however it ends. A block whose lock can be taken exclusively, and whose
header is complete, has no user left: making a block of a name taken by such a block
replaces it (a test killed by a timeout does not block its next run), and making a
source sweeps such blocks among those the class named itself
(``granary_<pid>_src_<token>``). A block another process still holds is never removed.
Workers that still map an unlinked block keep reading it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import mmap
import operator
import os
import pickle
import struct
import weakref
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, SupportsIndex

import numpy as np

from ._indexing import as_index_array, check_index

SHM_DIR = "/dev/shm"
# The blocks this class names itself are PREFIX<pid of its maker>_src_<token> (the pid
# is for people reading /dev/shm; whether a block is left over is told by its lock).
PREFIX = "granary_"
ALIGN = 64

# A block of this class begins MAGIC, the header's length (uint32), the header (JSON).
MAGIC = b"GRANARY\x01"
_HEAD = struct.Struct("<8sI")
# The Python types stored as one numpy array, by the dtype that holds them exactly.
_SCALARS = {bool: np.dtype(np.bool_), int: np.dtype(np.int64), float: np.dtype(np.float64)}


def round_up(n: int, to: int = ALIGN) -> int:
    return (n + to - 1) // to * to


def create_block(name: str, size: int) -> tuple[mmap.mmap, int]:
    """Creates ``/dev/shm/<name>`` (which must not exist) of ``size`` bytes and maps it;
    returns the mapping and a descriptor holding the block's shared lock (the caller
    closes it once it holds the lock otherwise: see the module docstring).

    The lock is taken before anything is written, so no sweep takes a block being made.
    The space is reserved up front (``posix_fallocate``), so a full ``/dev/shm`` fails
    here (an ``OSError`` saying how much was asked, how much is free and what to do),
    not as a ``SIGBUS`` when the mapping is written; on failure nothing is left.
    """
    path = os.path.join(SHM_DIR, name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.ENOMEM):
                raise
            raise _no_room(path, size, exc.errno) from None
        return mmap.mmap(fd, size), fd
    except BaseException:
        _unlink(path)
        os.close(fd)
        raise


def _no_room(path: str, size: int, code: int) -> OSError:
    """The error of a block that ``/dev/shm`` has no room for (``errno`` kept: ENOSPC)."""
    try:
        fs = os.statvfs(SHM_DIR)
        room = f"{fs.f_bavail * fs.f_frsize / 2**20:.1f} MiB free of {fs.f_blocks * fs.f_frsize / 2**20:.0f} MiB"
    except OSError:
        room = "free space unknown"
    return OSError(
        code,
        f"{SHM_DIR} has no room for a shared-memory block of {size / 2**20:.1f} MiB ({room}): it is "
        f"a memory file system of a fixed size, which Docker makes 64 MiB unless told otherwise; "
        f"give it more (docker run --shm-size=4g ..., or on Kubernetes an emptyDir volume with "
        f"medium: Memory mounted at {SHM_DIR}), or, for a numpy array, use "
        f"InMemoryDataSource(array), which shares it with worker processes in memory that "
        f"{SHM_DIR}'s size does not bound",
        path,
    )


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def unlink_if_unused(path: str) -> bool:
    """Unlinks the block at ``path`` if it is a finished block of this class that no
    process holds (its lock taken exclusively, without waiting); True if it did.

    The name goes while the lock is held: a process that opened the block just before
    locks it once unlinked and keeps reading it, as a worker that mapped it does.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.pread(fd, len(MAGIC), 0) != MAGIC:  # being made, or not this class's
            return False
        _unlink(path)
        return True
    except OSError:  # BlockingIOError: some process holds it
        return False
    finally:
        os.close(fd)


def sweep_orphans() -> int:
    """Unlinks the blocks this class named itself that no process holds any more (their
    makers and readers ended without closing them); returns how many."""
    count = 0
    with contextlib.suppress(OSError):
        for name in os.listdir(SHM_DIR):
            if name.startswith(PREFIX) and "_src_" in name:
                count += unlink_if_unused(os.path.join(SHM_DIR, name))
    return count


def _unlink_in(pid: int, path: str) -> None:
    # A forked child inherits the finalizer; only the maker removes the block.
    if os.getpid() == pid:
        _unlink(path)


class _Pieces(NamedTuple):
    """A part stored as the concatenation of ``pieces`` (written one after another into
    the block, never joined in memory first): ``items`` items of ``dtype``."""

    dtype: np.dtype
    items: int
    pieces: list[Any]  # bytes or numpy arrays of ``dtype``


Parts = list[tuple[str, np.ndarray | _Pieces]]


def _blobs(kind: str, blobs: list[bytes]) -> tuple[str, Parts, int]:
    """A part of offsets and one of the ``blobs`` end to end."""
    offsets = np.zeros(len(blobs) + 1, np.int64)
    np.cumsum([len(b) for b in blobs], out=offsets[1:])
    return kind, [("offsets", offsets), ("data", _Pieces(np.dtype(np.uint8), int(offsets[-1]), blobs))], len(blobs)


def _pickled(elements: Sequence[Any]) -> tuple[str, Parts, int]:
    blobs = []
    for i, element in enumerate(elements):
        try:
            blobs.append(pickle.dumps(element, protocol=pickle.HIGHEST_PROTOCOL))
        except Exception as error:
            raise TypeError(
                f"record {i} ({type(element).__name__}) cannot be pickled into shared memory: "
                f"{error}; use InMemoryDataSource, which workers receive with cloudpickle"
            ) from error
    return _blobs("objects", blobs)


def _layout_of(elements: Any) -> tuple[str, Parts, int]:
    """``(kind, [(part name, what to store)], length)`` for what ``elements`` is."""
    if isinstance(elements, np.ndarray):
        if elements.ndim == 0:
            raise TypeError(
                f"SharedMemoryDataSource needs an array of records along axis 0, got a 0-d "
                f"array of dtype {elements.dtype}; pass array.reshape(1) or a list"
            )
        if elements.dtype == object:
            return _pickled(list(elements))
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
            f"SharedMemoryDataSource takes a numpy array, a dict of arrays or a sequence of "
            f"records, got {type(elements).__name__}; pass a list"
        )
    types = {type(e) for e in elements}
    if len(types) != 1:  # none (empty) or mixed
        return _pickled(elements)
    (kind_type,) = types
    if kind_type in (bytes, str):
        blobs = [e.encode() for e in elements] if kind_type is str else list(elements)
        return _blobs(kind_type.__name__, blobs)
    if kind_type is np.ndarray:
        arrays, first = list(elements), elements[0]
        if any(a.dtype != first.dtype or a.ndim != first.ndim or a.ndim == 0 for a in arrays):
            raise TypeError("a sequence of arrays needs one dtype and one number of dimensions (>= 1)")
        shapes = np.asarray([a.shape for a in arrays], np.int64)
        offsets = np.zeros(len(arrays) + 1, np.int64)
        np.cumsum([a.size for a in arrays], out=offsets[1:])
        data = _Pieces(first.dtype, int(offsets[-1]), arrays)
        return "arrays", [("shapes", shapes), ("offsets", offsets), ("data", data)], len(arrays)
    if kind_type in _SCALARS:
        with contextlib.suppress(OverflowError):  # ints beyond int64 are pickled instead
            return "scalars", [("data", np.array(elements, _SCALARS[kind_type]))], len(elements)
    return _pickled(elements)


def _write(dest: np.ndarray, start: int, part: np.ndarray | _Pieces) -> None:
    """Writes ``part``'s bytes into ``dest`` (the block as uint8) from ``start``."""
    # A memoryview slice takes bytes as they are: no numpy view made per record.
    view = dest.data
    for piece in part.pieces if isinstance(part, _Pieces) else [part]:
        raw = piece if isinstance(piece, bytes) else np.ascontiguousarray(piece).reshape(-1).view(np.uint8).data
        view[start : start + len(raw)] = raw
        start += len(raw)


def _check_name(name: object, creating: bool) -> str:
    """The block's file name in /dev/shm for a name as Grain takes it ("x" or "/x")."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__} {name!r}")
    bare = name[1:] if name.startswith("/") else name  # POSIX spells shm names "/x"
    if not bare or "/" in bare or "\0" in bare or bare in (".", "..") or len(bare.encode()) > 255:
        raise ValueError(
            f"name {name!r} is not a shared-memory block name; pass up to 255 characters "
            f"without '/', such as 'my_dataset'"
        )
    if creating and bare.startswith(PREFIX):
        raise ValueError(
            f"name {name!r} starts with {PREFIX!r}, which marks the loader's own blocks (they "
            f"are removed once no process uses them); pick another name"
        )
    return bare


class SharedMemoryDataSource:
    """An in-memory source stored once in shared memory (see the module docstring).

    Takes Grain's arguments: ``SharedMemoryDataSource(elements)`` stores ``elements``
    in a new block, ``SharedMemoryDataSource(elements, name="x")`` in a block named
    ``x``, and ``SharedMemoryDataSource(name="x")`` reads the block ``x`` that another
    source made (in this process or another one).

    Args:
        elements: A numpy array, a dict of columns, or a sequence of records (bytes, str,
            arrays, numbers or any picklable objects; it may be empty).
        name: The block's name (``"x"`` or ``"/x"``, the file ``/dev/shm/x``). With
            ``elements``: a name no block has yet. Alone: the block to read.

    Raises:
        TypeError, ValueError: naming what cannot be stored and what to do.
        FileExistsError: ``elements`` and a ``name`` that a block already has.
        FileNotFoundError: ``name`` alone, and no block of that name.

    Example:
        >>> source = SharedMemoryDataSource(np.arange(12).reshape(4, 3))
        >>> source[2].tolist(), len(source)
        ([6, 7, 8], 4)
        >>> SharedMemoryDataSource([3, 1, 2])[1]
        1
    """

    def __init__(self, elements: Any = None, *, name: str | None = None) -> None:
        if elements is None:
            if name is None:
                raise ValueError(
                    "SharedMemoryDataSource needs records or the name of a block to read; pass "
                    "SharedMemoryDataSource(records) or SharedMemoryDataSource(name='...')"
                )
            self._name = _check_name(name, creating=False)
            self._attach(missing=f"no shared-memory block is named {self._name!r}; make it first "
                         f"with SharedMemoryDataSource(records, name={self._name!r})")
            return
        bare = None if name is None else _check_name(name, creating=True)
        kind, parts, length = _layout_of(elements)
        layout, offset = [], 0
        for part_name, part in parts:
            if isinstance(part, _Pieces):
                dtype, shape, nbytes = part.dtype, (part.items,), part.items * part.dtype.itemsize
            else:
                dtype, shape, nbytes = part.dtype, part.shape, part.nbytes
            layout.append((part_name, dtype.str, list(shape), offset))  # offsets from the data
            offset = round_up(offset + nbytes)
        header = json.dumps({"kind": kind, "length": length, "layout": layout}).encode()
        start = round_up(_HEAD.size + len(header))
        if bare is None:
            sweep_orphans()  # what killed makers left: a source is made seldom, a listing is cheap
        self._name = bare or f"{PREFIX}{os.getpid()}_src_{os.urandom(4).hex()}"
        path = os.path.join(SHM_DIR, self._name)
        try:
            target, lock_fd = create_block(self._name, start + max(offset, 1))
        except FileExistsError:
            if not unlink_if_unused(path):
                raise FileExistsError(
                    f"a shared-memory block named {self._name!r} already exists; read it with "
                    f"SharedMemoryDataSource(name={self._name!r}), pick another name, or remove "
                    f"{path} if it is left over"
                ) from None
            # left by processes that all ended without removing it
            target, lock_fd = create_block(self._name, start + max(offset, 1))
        dest = np.frombuffer(target, np.uint8)  # written in place: no temporary copy
        try:
            for (_, _, _, part_start), (_, part) in zip(layout, parts):
                _write(dest, start + part_start, part)
            # The magic goes last: a reader attaching by name never sees a half-made block.
            target[_HEAD.size : _HEAD.size + len(header)] = header
            target[: _HEAD.size] = _HEAD.pack(MAGIC, len(header))
        except BaseException:
            _unlink(path)
            os.close(lock_fd)
            raise
        finally:
            del dest  # the mapping closes only once no array views it
            target.close()
        self._finalizer = weakref.finalize(self, _unlink_in, os.getpid(), path)
        try:
            self._attach(missing=f"shared-memory block {self._name!r} vanished as it was made")
        finally:
            os.close(lock_fd)  # the source's own lock (taken by _attach) holds it from here on

    @property
    def name(self) -> str:
        """The shared-memory block holding the records (the file ``/dev/shm/<name>``)."""
        return self._name

    def _attach(self, missing: str) -> None:
        """Maps the block and holds its shared lock until the source is closed or
        collected (see the module docstring)."""
        path = os.path.join(SHM_DIR, self._name)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise FileNotFoundError(missing) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            size = os.fstat(fd).st_size
            block = mmap.mmap(fd, size, prot=mmap.PROT_READ) if size >= _HEAD.size else None
        except BaseException:
            os.close(fd)
            raise
        magic, header_size = _HEAD.unpack_from(block) if block is not None else (b"", 0)
        if block is None or magic != MAGIC:
            os.close(fd)
            raise ValueError(
                f"shared-memory block {self._name!r} was not made by SharedMemoryDataSource "
                f"(or is still being written); pass the name of a block that one made"
            )
        self._held = weakref.finalize(self, os.close, fd)
        header = json.loads(block[_HEAD.size : _HEAD.size + header_size])
        start = round_up(_HEAD.size + header_size)
        base = np.frombuffer(block, np.uint8)
        parts = {}
        for name, dtype, shape, offset in header["layout"]:
            count = int(np.prod(shape, dtype=np.int64))
            begin = start + offset
            parts[name] = base[begin : begin + count * np.dtype(dtype).itemsize].view(dtype).reshape(shape)
        self._kind, self._length, self._size = header["kind"], header["length"], size
        self._parts: dict[str, np.ndarray] | None = parts

    def close(self) -> None:
        """Stops reading here; the source that made the block also removes it.

        Records already read stay valid (the mapping closes with the last of them).
        """
        self._parts = None
        finalizer = self.__dict__.get("_finalizer")
        if finalizer is not None:
            finalizer()
        held = self.__dict__.get("_held")
        if held is not None:
            held()

    def unlink(self) -> None:
        """Removes the block's name now (Grain's ``unlink``); mappings keep reading it."""
        finalizer = self.__dict__.get("_finalizer")
        if finalizer is not None:
            finalizer()
        else:
            _unlink(os.path.join(SHM_DIR, self._name))

    def __enter__(self) -> SharedMemoryDataSource:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        # The name only: the receiving process maps the same block and reads its header.
        return {"_name": self._name}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._name = state["_name"]
        self._attach(
            missing=f"shared-memory block {self._name} of a SharedMemoryDataSource is gone: the "
            f"process that made it ended or dropped the source; keep the source alive "
            f"while workers read it"
        )

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: SupportsIndex) -> Any:
        return self._record(self._open_parts(), check_index(operator.index(index), self._length))

    def __getitems__(self, indices: Sequence[int] | np.ndarray) -> list[Any]:
        parts, array = self._open_parts(), as_index_array(indices, self._length)
        if self._kind == "scalars":
            return parts["data"][array].tolist()
        return [self._record(parts, i) for i in array.tolist()]

    def _open_parts(self) -> dict[str, np.ndarray]:
        if self._parts is None:
            raise ValueError(f"{self!r} is closed; read from a source that is open")
        return self._parts

    def _record(self, parts: dict[str, np.ndarray], i: int) -> Any:
        kind = self._kind
        if kind == "array":
            return parts["data"][i]
        if kind == "scalars":
            return parts["data"][i].item()
        if kind == "columns":
            return {name: column[i] for name, column in parts.items()}
        start, stop = int(parts["offsets"][i]), int(parts["offsets"][i + 1])
        if kind == "bytes":
            return parts["data"][start:stop].tobytes()
        if kind == "str":
            return parts["data"][start:stop].tobytes().decode()
        if kind == "objects":
            return pickle.loads(parts["data"][start:stop].data)
        return parts["data"][start:stop].reshape(tuple(parts["shapes"][i].tolist()))

    def __repr__(self) -> str:
        # An automatic name differs per run, so only a name the user chose is shown.
        name = "" if self._name.startswith(PREFIX) else f", name={self._name!r}"
        return f"SharedMemoryDataSource(<{self._kind} of {self._length} records, {self._size / 2**20:.1f} MiB>{name})"

    def __str__(self) -> str:
        # Grain's text, which names the class by the alias grain.python exports it as.
        return f"InMemoryDataSource(name={self._name}, len={self._length})"
