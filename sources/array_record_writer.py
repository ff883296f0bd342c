"""Writing records to an ArrayRecord file, ready for random access."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterable

from array_record.python.array_record_module import ArrayRecordWriter


def _as_bytes(record: object, position: int) -> bytes:
    if isinstance(record, bytes):
        return record
    try:
        # Any bytes-like object (bytearray, memoryview, a numpy array's buffer).
        return memoryview(record).tobytes()  # type: ignore[arg-type]
    except TypeError:
        hint = "; encode it first, e.g. text.encode()" if isinstance(record, str) else ""
        raise TypeError(
            f"record {position} is {type(record).__name__}, expected bytes or another "
            f"bytes-like object (bytearray, memoryview){hint}"
        ) from None


def _staging_path(path: str) -> str:
    """Creates the folder of ``path`` (and its parents) if missing, as ``convert`` does,
    and returns a hidden temporary name beside ``path``, to rename into place once written.

    Raises:
        OSError: the folder cannot be made (a file stands where a folder must be, no
            permission); the message names ``path`` and the folder.
    """
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as error:
        raise type(error)(
            error.errno, f"cannot write {path!r}: cannot create its folder {directory!r} "
            f"({error.strerror}); check the path"
        ) from error
    return os.path.join(directory, f".{os.path.basename(path)}.{uuid.uuid4().hex[:12]}.tmp")


def write_array_record(
    path: str | os.PathLike,
    records: Iterable[bytes],
    *,
    group_size: int = 1,
    options: str | None = None,
) -> int:
    """Writes ``records`` to one ArrayRecord file and returns how many it wrote.

    ``group_size`` is 1 by default because random access needs it: the reader
    decodes a whole group to return any one record of it, so with
    ``group_size=64`` every random read decodes 64 records. Larger groups only
    pay off for files read sequentially.

    The records go to a temporary file in the same directory, renamed to
    ``path`` only once the writer has closed cleanly, so a failure (an error in
    ``records``, a full disk, Ctrl-C) never leaves a half-written file under
    ``path``. An existing file at ``path`` is replaced; missing folders on the way
    to it are created.

    Args:
        path: The file to write.
        records: Bytes-like records (``bytes``, ``bytearray``, ``memoryview``).
        group_size: Records per compressed group; at least 1.
        options: More ArrayRecord writer options, comma-separated, for example
            ``"zstd:5"`` or ``"uncompressed"``. Must not repeat ``group_size``.

    Returns:
        The number of records written.

    Raises:
        TypeError: A record is not bytes-like; the message names its position.
        ValueError: ``group_size`` < 1, or ``options`` is invalid.
        OSError: The folder of ``path`` cannot be created, or the writer failed.

    Example:
        >>> from sources import write_array_record
        >>> write_array_record("/tmp/three.array_record", [b"a", b"b", b"c"])
        3
    """
    path = os.fspath(path)
    if isinstance(group_size, bool) or not isinstance(group_size, int):
        raise TypeError(
            f"group_size must be an int, got {type(group_size).__name__} {group_size!r}"
        )
    if group_size < 1:
        raise ValueError(
            f"group_size must be at least 1, got {group_size}; use 1 for random access"
        )
    writer_options = f"group_size:{group_size}"
    if options:
        if "group_size" in options:
            raise ValueError(
                f"options {options!r} set group_size; pass group_size={group_size} as "
                "the keyword argument instead"
            )
        writer_options += f",{options}"
    temp_path = _staging_path(path)
    try:
        writer = ArrayRecordWriter(temp_path, writer_options)
    except ValueError as error:
        raise ValueError(
            f"invalid ArrayRecord writer options {writer_options!r}: {error}"
        ) from None
    count = 0
    try:
        if not writer.ok():
            raise OSError(f"could not open {temp_path!r} for writing {path!r}")
        for record in records:
            data = _as_bytes(record, count)
            try:
                writer.write(data)
            except RuntimeError as error:  # How the writer reports I/O failures.
                raise OSError(f"writing ArrayRecord file {path!r} failed: {error}") from error
            count += 1
        try:
            writer.close()
        except RuntimeError as error:
            raise OSError(f"writing ArrayRecord file {path!r} failed: {error}") from error
        os.replace(temp_path, path)
    except BaseException:
        if writer.is_open():
            with contextlib.suppress(RuntimeError):
                writer.close()
        with contextlib.suppress(FileNotFoundError):
            os.remove(temp_path)
        raise
    return count
