"""An array held once for a whole process tree, in memory that has no name.

:class:`ArrayBlock` copies a numpy array into a ``memfd`` (``memfd_create``: memory with
no name in ``/dev/shm`` or anywhere else, mode 0600) and reads it back as a read-only
view. Pickled, it sends a few dozen bytes: the pid of a process holding the block and
the block's descriptor there; the process that unpickles it opens the block through
``/proc/<pid>/fd/<fd>`` and maps it read-only. So the training process, the fork server
and every worker map the same pages: the tree holds the array once, whatever the number
of workers.

Why a ``memfd`` and not a named ``/dev/shm`` block (:mod:`.shared_memory`): its size is
bounded by memory (the machine's, the container's memory limit), not by ``/dev/shm``'s,
which Docker makes 64 MiB unless told ``--shm-size``; and nothing is left to remove: the
kernel frees the block once the last process holding a descriptor or a mapping of it has
let go, however it ended.

The maker maps the block with ``MAP_POPULATE``, so its PSS counts the whole array from
the start (and the processes that map it later share those pages): a tree's PSS tells
the memory the block takes, never less.

The space is reserved up front (``posix_fallocate``), so memory that runs out is an
error when the block is made, naming the size, not a ``SIGBUS`` while it is written.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import weakref
from typing import Any

import numpy as np

# The block begins with MAGIC and a random token (a process that opens a descriptor
# number that was reused finds another token), padded to HEADER: the data is aligned.
MAGIC = b"GRANARY-ARRAY\x01"
HEADER = 64


def _available_memory() -> str:
    with contextlib.suppress(OSError, StopIteration, ValueError):
        with open("/proc/meminfo") as f:
            kib = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
        return f"{kib / 1024:.0f} MiB available on this machine"
    return "memory available unknown"


def _new_block(size: int, what: str) -> int:
    """A ``memfd`` of ``size`` bytes, reserved, readable by this user only (0600)."""
    fd = os.memfd_create("granary-in-memory", os.MFD_CLOEXEC)
    try:
        os.fchmod(fd, 0o600)
        os.ftruncate(fd, size)
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.ENOMEM):
                raise
            raise OSError(
                exc.errno,
                f"no memory left to hold {what} ({size / 2**20:.1f} MiB) once for the worker "
                f"processes ({_available_memory()}; a container's memory limit may be lower): "
                f"free memory, raise the limit, or read the records from files "
                f"(ArrayRecordDataSource) instead of holding them in memory",
            ) from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def _view(fd: int, size: int, token: bytes, dtype: np.dtype, shape: tuple[int, ...], populate: bool) -> np.ndarray:
    """The block's array, read-only; ValueError if the block's token is not ``token``."""
    flags = mmap.MAP_SHARED | (mmap.MAP_POPULATE if populate else 0)
    mapped = mmap.mmap(fd, size, flags=flags, prot=mmap.PROT_READ)
    if mapped[:HEADER] != (MAGIC + token).ljust(HEADER, b"\0"):
        mapped.close()
        raise ValueError("not the block it was")
    count = int(np.prod(shape, dtype=np.int64))
    # The array keeps the mapping alive; nothing else needs to.
    return np.frombuffer(mapped, dtype=dtype, count=count, offset=HEADER).reshape(shape)


class ArrayBlock:
    """A copy of ``array`` in a ``memfd``, shared with the processes that unpickle it.

    Args:
        array: a numpy array without Python objects (any strides, any order).

    Attributes:
        array: the copy, read-only, C-contiguous, equal to ``array``.

    Raises:
        OSError: the memory could not be reserved (the message names the size).
    """

    def __init__(self, array: np.ndarray) -> None:
        size = HEADER + array.nbytes
        fd = _new_block(size, f"an array of shape {array.shape} and dtype {array.dtype}")
        token = os.urandom(16)
        try:
            with mmap.mmap(fd, size) as target:
                target[:HEADER] = (MAGIC + token).ljust(HEADER, b"\0")
                dest = np.frombuffer(target, dtype=array.dtype, count=array.size, offset=HEADER)
                np.copyto(dest.reshape(array.shape), array)  # strided or not: no temporary copy
                del dest  # the mapping closes only once no array views it
            self.array = _view(fd, size, token, array.dtype, array.shape, populate=True)
        except BaseException:
            os.close(fd)
            raise
        self._adopt(fd, token)

    def _adopt(self, fd: int, token: bytes) -> None:
        self._fd, self._token = fd, token
        self._closer = weakref.finalize(self, os.close, fd)

    def close(self) -> None:
        """Lets go of the descriptor: no process can open the block through this one any
        more. The memory is freed once no process maps it (arrays read from it keep it)."""
        self._closer()

    def __getstate__(self) -> dict[str, Any]:
        if not self._closer.alive:
            raise ValueError("an InMemoryDataSource closed cannot be sent to other processes; use one that is open")
        array = self.array
        return {"pid": os.getpid(), "fd": self._fd, "token": self._token, "dtype": array.dtype, "shape": array.shape}

    def __setstate__(self, state: dict[str, Any]) -> None:
        path = f"/proc/{state['pid']}/fd/{state['fd']}"
        dtype, shape = state["dtype"], tuple(state["shape"])
        size = HEADER + dtype.itemsize * int(np.prod(shape, dtype=np.int64))
        gone = (
            f"an InMemoryDataSource's records, held in the memory of process {state['pid']}, "
            f"cannot be read at {path}"
        )
        todo = (
            "keep the source open while workers read it; where /proc/<pid>/fd is hidden, or "
            "for processes on other machines, read the records from files (ArrayRecordDataSource) "
            "or from a named block (SharedMemoryDataSource, on one machine)"
        )
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise OSError(exc.errno, f"{gone} ({exc.strerror}): the process ended or closed the source, "
                          f"or this system hides it; {todo}") from None
        try:
            if os.fstat(fd).st_size != size:
                raise ValueError("not the block it was")
            self.array = _view(fd, size, state["token"], dtype, shape, populate=False)
        except ValueError:
            os.close(fd)
            raise OSError(errno.ESTALE, f"{gone}: that descriptor is another file now (the source was "
                          f"closed); {todo}") from None
        except BaseException:
            os.close(fd)
            raise
        # This copy holds a descriptor of its own: pickled again, it names this process.
        self._adopt(fd, state["token"])
