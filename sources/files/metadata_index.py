"""Per-file metadata read once per job: the index file, checked against the files.

Before a source can read a file it needs what the file says about itself: an ArrayRecord
file's record count (and, in an object store, its chunk index), a Parquet file's columns
and row groups, where each TFRecord record and each JSONL line starts. Read from every
file by every process of every host, that is files x hosts requests at start-up. So the
file sources keep it in an **index file**, written once and read by everyone:

* **where**: beside the data (:data:`INDEX_NAME` in each file's directory, where
  ``python -m dataloader index PATHS`` writes it), or any path or URL you choose (a cache
  path, ``s3://bucket/cache/index.json``);
* **what**: one entry a file, keyed by its absolute path or URL: its kind, its size and
  modification time when it was read, and the metadata (JSON; arrays of integers packed
  as base64 of their zlib'd deltas, about a byte per TFRecord or JSONL record);
* **checked**: an entry is used only if the file still has the size and modification
  time it had. A file that changed is refused by name (``ValueError``: which file, what
  changed, and the command that rebuilds the index), never read through a stale entry;
* **written atomically**: to a temporary name, then renamed (a single PUT in an object
  store, which is atomic there). Writers merge what is on disk first, so concurrent
  writers never corrupt it (the last one's new entries win; others are read again next
  time).

A source takes ``index=``: ``None`` (the default) uses the index beside the data where
there is one and never writes; ``True`` uses it and adds the files it lacks; a path or URL
uses (and writes) that index file; ``False`` uses none. Worker processes do not read an
index: the metadata travels with the pickled source (past a few million records, a JSONL
or TFRecord source travels without its offsets, and a worker takes those of the files it
reads from the index, or from the files where there is none).

Example:
    >>> import dataloader as dl, os
    >>> _ = open("/tmp/doc.jsonl", "w").write('{"a": 1}\\n{"a": 2}\\n')
    >>> dl.JsonlDataSource("/tmp/doc.jsonl", index=True)[1]
    {'a': 2}
    >>> os.path.exists("/tmp/_granary_index.json")
    True
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import json
import os
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

INDEX_NAME = "_granary_index.json"
"""The index file's name beside the data (a leading ``_``: dataset readers such as
pyarrow's skip such files, and the sources' globs leave it out)."""

_FORMAT, _VERSION = "granary-index", 1


@dataclasses.dataclass(frozen=True, order=True)
class FileStat:
    """A file as an index entry knows it.

    Attributes:
        path: the absolute path, or the URL.
        size: bytes.
        mtime_ns: the modification time in ns; 0 where the store does not say (then only
            the size is checked).
    """

    path: str
    size: int
    mtime_ns: int


def stat_local(path: str) -> FileStat:
    info = os.stat(path)
    return FileStat(os.path.abspath(path), info.st_size, info.st_mtime_ns)


def mtime_ns(info: Mapping[str, Any]) -> int:
    """The modification time of an fsspec ``info`` dict in ns (0 when it has none)."""
    for key in ("mtime", "LastModified", "last_modified", "updated", "modified", "created"):
        value = info.get(key)
        if isinstance(value, datetime.datetime):
            return int(value.timestamp() * 1e9)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return int(value * 1e9)
        if isinstance(value, str):
            try:
                return int(datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1e9)
            except ValueError:
                continue
    return 0


def pack_ints(array: np.ndarray) -> str:
    """Integers as base64 of their zlib'd int64 deltas (sorted offsets pack to ~1 byte each)."""
    deltas = np.diff(np.asarray(array, dtype=np.int64), prepend=0).astype("<i8")
    return base64.b64encode(zlib.compress(deltas.tobytes(), 6)).decode("ascii")


def unpack_ints(text: str) -> np.ndarray:
    raw = zlib.decompress(base64.b64decode(text))
    return np.cumsum(np.frombuffer(raw, dtype="<i8")).astype(np.int64)


def rebuild_hint(path: str, location: str | None) -> str:
    where = "" if location is None or _beside(path) == location else f" --index_path={location}"
    return f"python -m dataloader index {path}{where}"


def _beside(path: str) -> str:
    return path.rsplit("/", 1)[0] + "/" + INDEX_NAME if "://" in path else os.path.join(
        os.path.dirname(os.path.abspath(path)), INDEX_NAME)


def _when(ns: int) -> str:
    when = datetime.datetime.fromtimestamp(ns / 1e9, datetime.timezone.utc)
    return when.isoformat(timespec="microseconds" if ns % 10**9 else "seconds")


class MetadataIndex:
    """The entries of one index file (see the module).

    Args:
        location: the file's path or URL; None for an index that lives in memory only
            (one process posted it to the others, see ``shared_array_record_source``).
        storage_options: for a URL, passed to its fsspec file system.
    """

    def __init__(self, location: str | None = None, storage_options: Mapping[str, Any] | None = None) -> None:
        self.location = None if location is None else os.fspath(location)
        self._storage_options = dict(storage_options or {})
        self.entries: dict[str, dict[str, Any]] = {}
        self._added: dict[str, dict[str, Any]] = {}

    @classmethod
    def load(cls, location: str, storage_options: Mapping[str, Any] | None = None) -> MetadataIndex:
        """The index at ``location``; empty when there is none yet. A local index is parsed
        once per process while it keeps its size and time (sources built one per file,
        as MaxText builds them, would otherwise parse it once per file).

        Raises:
            ValueError: the file there is not an index this version reads.
        """
        index = cls(location, storage_options)
        key = None
        if "://" not in index.location:  # type: ignore[operator]
            try:
                info = os.stat(location)
            except FileNotFoundError:
                return index
            # (each save is a new file: its inode tells two saves in one tick of the clock apart)
            key = (os.path.abspath(location), info.st_ino, info.st_size, info.st_mtime_ns)
            if key in _PARSED:
                index.entries = dict(_PARSED[key])
                return index
        data = index._read()
        if data is not None:
            index.entries = cls._parse(data, location)
            if key is not None:
                if len(_PARSED) >= _PARSED_KEPT:
                    _PARSED.clear()
                _PARSED[key] = dict(index.entries)
        return index

    @staticmethod
    def _parse(data: bytes, location: str) -> dict[str, dict[str, Any]]:
        try:
            content = json.loads(data)
        except ValueError:
            content = None
        if not isinstance(content, dict) or content.get("format") != _FORMAT:
            raise ValueError(
                f"{location!r} is not a granary metadata index; delete it or pass another "
                f"index location (python -m dataloader index PATHS --index_path=...)"
            )
        if content.get("version") != _VERSION:
            raise ValueError(
                f"the index {location!r} has version {content.get('version')!r}, this granary "
                f"reads version {_VERSION}; rebuild it with python -m dataloader index PATHS"
            )
        return dict(content["files"])

    def to_bytes(self) -> bytes:
        return json.dumps({"format": _FORMAT, "version": _VERSION, "files": self.entries}).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> MetadataIndex:
        """An index read from bytes another process sent (it lives in memory only)."""
        index = cls()
        index.entries = cls._parse(data, "the index received")
        return index

    def lookup(self, stat: FileStat, kind: str) -> dict[str, Any] | None:
        """The metadata of ``stat``'s file, None when the index has no entry for it.

        Raises:
            ValueError: the entry is stale (the file's size or modification time changed).
        """
        entry = self.entries.get(stat.path)
        if entry is None or entry.get("kind") != kind:
            return None
        changes = []
        if entry["size"] != stat.size:
            changes.append(f"its size was {entry['size']:,} bytes and is {stat.size:,} now")
        if entry["mtime_ns"] and stat.mtime_ns and entry["mtime_ns"] != stat.mtime_ns:
            changes.append(f"its modification time is {_when(stat.mtime_ns)} now, "
                           f"{_when(entry['mtime_ns'])} when the index read it")
        if changes:
            where = "the index received" if self.location is None else f"the index {self.location!r}"
            raise ValueError(
                f"{where} has a stale entry for {stat.path!r}: {' and '.join(changes)}; it was "
                f"not read. Rebuild the index: {rebuild_hint(stat.path, self.location)}"
            )
        return entry["meta"]

    def forget(self, paths: Sequence[str]) -> None:
        """Drops the entries of ``paths`` here (not on disk), so they are read again and
        replace what the file holds at the next :meth:`save`."""
        for path in paths:
            self.entries.pop(path, None)

    def add(self, stat: FileStat, kind: str, meta: dict[str, Any]) -> None:
        entry = {"kind": kind, "size": stat.size, "mtime_ns": stat.mtime_ns, "meta": meta}
        self.entries[stat.path] = self._added[stat.path] = entry

    def save(self) -> None:
        """Writes the entries added since the last save, merged into what is there now."""
        if not self._added or self.location is None:
            return
        current = self._read()
        entries = self._parse(current, self.location) if current is not None else {}
        entries.update(self._added)
        self.entries = entries
        self._write(self.to_bytes())
        self._added = {}

    def _read(self) -> bytes | None:
        assert self.location is not None
        if "://" in self.location:
            from ..remote.urls import read_object

            return read_object(self.location, self._storage_options)
        try:
            with open(self.location, "rb") as file:
                return file.read()
        except FileNotFoundError:
            return None

    def _write(self, data: bytes) -> None:
        assert self.location is not None
        if "://" in self.location:  # one PUT: atomic in an object store
            from ..remote.urls import write_object

            write_object(self.location, data, self._storage_options)
            return
        directory = os.path.dirname(os.path.abspath(self.location))
        os.makedirs(directory, exist_ok=True)
        temporary = os.path.join(directory, f".{os.path.basename(self.location)}.{os.getpid()}.{id(self):x}.tmp")
        try:
            with open(temporary, "wb") as out:
                out.write(data)
            os.replace(temporary, self.location)
        except BaseException:
            if os.path.exists(temporary):
                os.remove(temporary)
            raise


# Local indexes parsed in this process, by (path, inode, size, time of change).
_PARSED: dict[tuple[str, int, int, int], dict[str, dict[str, Any]]] = {}
_PARSED_KEPT = 16


def check_index_arg(index: Any) -> Any:
    """``index`` if it is an index argument (see the module), else a TypeError naming it."""
    if index is None or isinstance(index, bool | str | os.PathLike | MetadataIndex):
        return os.fspath(index) if isinstance(index, os.PathLike) else index
    raise TypeError(
        f"index must be None (the index beside the data, if any), True (beside the data, "
        f"written), False (none), a path or URL, got {type(index).__name__} {index!r}"
    )


def resolve(
    stats: Sequence[FileStat],
    kind: str,
    read: Callable[[list[FileStat]], list[dict[str, Any]]],
    index: Any = None,
    storage_options: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The metadata of each file: from its index where it has a fresh entry, else read
    (``read`` gets every file missing at once, so it can read them concurrently) and,
    unless ``index`` is None, added to the index (and saved, where it has a location).

    Raises:
        ValueError: an entry is stale, or an index file is not one.
    """
    index = check_index_arg(index)
    if index is False:
        return read(list(stats))
    holders: list[MetadataIndex] = []
    opened: dict[str, MetadataIndex] = {}
    for stat in stats:
        if isinstance(index, MetadataIndex):
            holders.append(index)
            continue
        location = _beside(stat.path) if index is None or index is True else index
        if location not in opened:
            opened[location] = MetadataIndex.load(location, storage_options)
        holders.append(opened[location])
    found = [holder.lookup(stat, kind) for holder, stat in zip(holders, stats)]
    missing = [i for i, meta in enumerate(found) if meta is None]
    if missing:
        for i, meta in zip(missing, read([stats[i] for i in missing]), strict=True):
            found[i] = meta
            if index is not None:  # None: the index beside the data is read, not written
                holders[i].add(stats[i], kind, meta)
        for holder in {id(h): h for h in holders}.values():
            if index is not None:
                holder.save()
    return found  # type: ignore[return-value]


def received_stats(index: Any, paths: Sequence[str]) -> list[FileStat] | None:
    """The files ``paths`` as an index received from another process knows them, when it
    knows them all (they are named, not globbed): that process checked them against the
    store a moment ago, so this one need not ask the store again. None otherwise."""
    if not isinstance(index, MetadataIndex) or index.location is not None:
        return None
    if any(set("*?[").intersection(path) for path in paths):
        return None
    entries = [index.entries.get(os.fspath(path)) for path in paths]
    if any(entry is None for entry in entries):
        return None
    return [FileStat(os.fspath(p), e["size"], e["mtime_ns"]) for p, e in zip(paths, entries)]  # type: ignore[index]
