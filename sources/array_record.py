"""Random access to records in ArrayRecord files.

The reading is done by the ``array_record`` package's own reader; this module
only maps global indices onto files, opens readers lazily in each process and
checks the files up front.

Choice of read call. Measured with array_record 0.8.6 on 200,000 records of
~1 KB written with ``group_size:1``, 10,240 records read in one random order,
file in the page cache, 2-core x86 VM, best of 3, µs per record
(``python tests/sources/bench_array_record_reads.py`` measures again):

=========================================  =========  ================  ==========
call                                       default    readahead 0       readahead 0
                                           options                      parallel 0
=========================================  =========  ================  ==========
(a) ``read([i])`` one at a time                  231               235         242
(b) ``read(i, i + 1)`` one at a time             3.2               3.2     3.0-4.3
(c) ``read(batch_of_128)`` per batch            12.1               7.1     6.0-12
(d) ``[read(i, i + 1)[0] for i in batch]``       3.2               3.2     2.9-5.6
(e) ``seek(i); read()``                          676               515         3.4
this source's ``__getitems__(int64 batch)``       --                --     3.5 (d: 3.4)
=========================================  =========  ================  ==========

(ranges: the VM is noisy; interleaved runs put (d) at 3.4 for all three option
sets.) ``read(list)`` first pays ~2 ns per record *of the file* on every call
(about 230 µs on this 200,000-record file, 4 µs on a 1,000-record one, most of
the time inside ``ParallelReadRecordsWithIndices``), so in 0.8.6 it loses to
one ``read(i, i + 1)`` per record even for batches of 128 (only near 512
records per call does it draw level). Both ``__getitem__`` and
``__getitems__`` therefore call ``read(i, i + 1)`` per record, with the
reader's documented random-access options
``readahead_buffer_size:0,max_parallelism:0``; ``max_parallelism:0`` makes no
measurable difference to ``read(i, i + 1)``. (Whatever the options, opening
the first reader in a process starts array_record's global pool of 64
threads; they sleep unless ``read(list)`` is used.)

Reader options. ``reader_options`` (Grain's argument, a dict of str) is added
to that options string. ``ArrayRecordReader`` 0.8.6 documents exactly four
keys and refuses any other one when a file is opened: ``index_storage_option``
(``in_memory``, the default, or ``offloaded``: the index of record offsets
stays in the file instead of memory), ``readahead_buffer_size``,
``max_parallelism`` and ``footer_prefetch_bytes``. The reader refuses
``offloaded`` with its default ``footer_prefetch_bytes`` of 1 MB (Grain
0.2.18 therefore fails on MaxText's ``{"index_storage_option": "offloaded"}``),
so this source adds ``footer_prefetch_bytes:0`` unless it was given.

A benchmark's "raw read" of the same records is this very call; the source
adds only a numpy bounds check per batch and, for several files, one
``searchsorted`` (about 0.1 µs per record in all).

URLs. Paths such as ``s3://bucket/train-*.array_record`` (any fsspec URL) are read
without a FUSE mount: the chunk index of each file is read once, here, and each
``__getitems__`` fetches the byte ranges of its records' chunks into a local sparse
file that the same reader decodes (:mod:`.remote.array_record` says how and why).
"""

from __future__ import annotations

import dataclasses
import os
import re
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, SupportsIndex

import numpy as np
from array_record.python.array_record_module import ArrayRecordReader

from ._indexing import PartIndex, as_index_array, as_index_list, check_index
from .files.handles import OPEN_FILES
from .files.metadata_index import FileStat, check_index_arg, received_stats, resolve, stat_local
from .files.paths import PathArg, PerProcessHandles, expand_paths, format_paths
from .remote import array_record as _remote
from .remote.urls import is_url, stat_urls

# Documented by ArrayRecordReader as its random-access setting (see above).
READER_OPTIONS = "readahead_buffer_size:0,max_parallelism:0"

# The keys ArrayRecordReader's options string understands (its docstring's grammar),
# each with the values it takes, as a pattern and in words for messages.
_SIZE = r"(?:auto|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?[BkKMGTPE]?)"
_READER_KEYS = {
    "index_storage_option": (r"in_memory|offloaded", "'in_memory' or 'offloaded'"),
    "readahead_buffer_size": (_SIZE, "a byte count such as 0, 65536 or '16M', or 'auto'"),
    "max_parallelism": (r"auto|\d+", "a count such as 0 or 8, or 'auto'"),
    "footer_prefetch_bytes": (_SIZE, "a byte count such as 0 or '1M', or 'auto'"),
}

_GROUP_SIZE = re.compile(r"(?:^|,)group_size:(\d+)(?:,|$)")


def _check_reader_options(options: Mapping[str, str | int] | None) -> dict[str, str]:
    """Returns ``options`` with str values after checking each key and value.

    Raises:
        TypeError: ``options`` is not a dict, or a key or value is not a str (or an
            int for a number).
        ValueError: A key the reader does not understand, or a value it refuses.
    """
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise TypeError(
            f"reader_options must be a dict of str, got {type(options).__name__} {options!r}; "
            "pass e.g. {'index_storage_option': 'offloaded'}"
        )
    checked = {}
    for key, value in options.items():
        if key not in _READER_KEYS:
            raise ValueError(
                f"reader_options key {key!r} is not an ArrayRecord reader option; the "
                f"reader understands {', '.join(map(repr, _READER_KEYS))}"
            )
        pattern, words = _READER_KEYS[key]
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise TypeError(
                f"reader_options[{key!r}] must be a str, got {type(value).__name__} "
                f"{value!r}; pass {words}"
            )
        if not re.fullmatch(pattern, str(value)):
            raise ValueError(f"reader_options[{key!r}] is {value!r}; pass {words}")
        checked[key] = str(value)
    offloaded = checked.get("index_storage_option") == "offloaded"
    if offloaded and checked.get("footer_prefetch_bytes", "0") not in ("0", "0.0"):
        raise ValueError(
            f"reader_options footer_prefetch_bytes={checked['footer_prefetch_bytes']!r} "
            "needs index_storage_option 'in_memory' (the reader prefetches no footer when "
            "the index is offloaded); drop footer_prefetch_bytes or set it to 0"
        )
    return checked


def _options_string(options: Mapping[str, str]) -> str:
    """The reader's options string: the random-access defaults, then ``options``."""
    merged = dict(item.split(":") for item in READER_OPTIONS.split(","))
    if options.get("index_storage_option") == "offloaded":
        merged.setdefault("footer_prefetch_bytes", "0")
    merged.update(options)
    return ",".join(f"{key}:{value}" for key, value in merged.items())


def _open_reader(path: str, options: str = READER_OPTIONS) -> ArrayRecordReader:
    """Opens ``path`` with ``options``; raises ValueError naming a bad file."""
    detail = ""
    try:
        reader = ArrayRecordReader(path, options)
        if reader.ok():
            return reader
        reader.close()  # A reader that failed to open raises why when closed.
    except RuntimeError as error:
        detail = f" ({error})"
    if not os.path.exists(path):
        raise FileNotFoundError(f"ArrayRecord file {path!r} does not exist (any more)")
    if os.path.getsize(path) == 0:
        raise ValueError(
            f"ArrayRecord file {path!r} is empty (0 bytes); remove it from paths or "
            "rewrite it with write_array_record"
        )
    raise ValueError(
        f"{path!r} is not a readable ArrayRecord file (corrupt, truncated or another "
        f"format){detail}; rewrite it with write_array_record"
    )


def _open_key(key: tuple[str, str, str]) -> ArrayRecordReader:
    """Opens the reader of a key of the shared cache, ``("array_record", path, options)``."""
    return _open_reader(key[1], key[2])


def read_metadata(
    stats: Sequence[FileStat], options: str = READER_OPTIONS, remote: _remote.RemoteOptions | None = None
) -> list[dict[str, Any]]:
    """What the metadata index keeps of each ArrayRecord file: its record count and writer
    options, read here (opening each local file; for URLs, the chunk indices, fetched
    concurrently, and the small files' head and tail bytes)."""
    if stats and is_url(stats[0].path):
        files, _ = _remote.load_files([(s.path, s.size) for s in stats], remote or _remote.RemoteOptions())
        return [file.to_meta() for file in files]
    metas = []
    for stat in stats:
        reader = _open_reader(stat.path, options)
        try:
            metas.append({"records": reader.num_records(), "writer_options": reader.writer_options_string() or ""})
        finally:
            reader.close()
    return metas


class ArrayRecordDataSource(PerProcessHandles):
    """Records of one or more ArrayRecord files as one indexable source.

    Records are numbered file after file, in the order of ``paths`` (files
    matched by a glob are sorted). Every file is opened once at construction
    to count its records and check it, unless the metadata index has it (then
    none is); readers for reading are then opened
    lazily, in the process that reads, through the process's bounded cache of
    open files (:func:`~dataloader.sources.set_max_open_files`): a mixture of
    thousands of these sources keeps at most that many files open. The source
    is thread-safe and picklable.

    Args:
        paths: A path, a glob pattern, or a list of those.
        reader_options: Options for array_record's reader, as Grain takes them:
            a dict of str such as ``{"index_storage_option": "offloaded"}``
            (keep the index of each file on disk instead of in memory). The
            keys are the reader's own (see the module docstring); they apply
            in every process that opens the files.
        storage_options: For URLs: passed to the fsspec file system as they are
            (``endpoint_url``, ``anon``, ``token``, ...). A shortcut for
            ``remote=RemoteOptions(storage_options=...)``.
        remote: For URLs: cache, index cache and retry settings
            (:class:`~dataloader.sources.RemoteOptions`).
        index: Where each file's record count (and, for a URL, its chunk index) is kept
            (:mod:`~dataloader.sources.files.metadata_index`): None (the index beside the data
            if there is one; for URLs ``remote.index_cache`` when set), True (beside the
            data, written if need be), a path or URL, or False (none).

    Raises:
        TypeError: ``paths`` is not a path, a glob or a list of those, or
            ``reader_options`` is not a dict of str.
        ValueError: ``paths`` is empty, or a file is empty, has no records or
            is not an ArrayRecord file, or ``reader_options`` holds a key or a
            value the reader does not understand, or the index has a stale entry.
        FileNotFoundError: A path does not exist or a glob matches nothing.

    Warns:
        UserWarning: Once per file written with ``group_size`` > 1: random
            access then decodes a whole group to return one record.

    Example:
        >>> from sources import ArrayRecordDataSource, write_array_record
        >>> write_array_record("/tmp/demo.array_record", [b"a", b"b", b"c"])
        3
        >>> source = ArrayRecordDataSource("/tmp/demo.array_record")
        >>> source[2], source.__getitems__([1, 0, 1])
        (b'c', [b'b', b'a', b'b'])
    """

    _TRANSIENT = ("_fetcher", "_keys")

    def __init__(
        self,
        paths: PathArg,
        reader_options: Mapping[str, str] | None = None,
        *,
        storage_options: Mapping[str, Any] | None = None,
        remote: _remote.RemoteOptions | None = None,
        index: Any = None,
    ) -> None:
        self._reader_options = _check_reader_options(reader_options)
        self._options = _options_string(self._reader_options)
        check_index_arg(index)
        items = [paths] if isinstance(paths, str | os.PathLike) else paths
        self._remote_files: tuple[_remote.RemoteFile, ...] = ()
        if isinstance(items, list | tuple) and items and any(is_url(p) for p in items):
            self._init_remote(list(items), storage_options, remote, index)
            return
        self._remote_options: _remote.RemoteOptions | None = None
        self._paths = tuple(expand_paths(paths, what="ArrayRecord", example_glob="*.array_record"))
        metas = resolve([stat_local(path) for path in self._paths], "array_record",
                        lambda stats: read_metadata(stats, self._options), index)
        self._set_files(metas)
        self._init_process_state()

    def _set_files(self, metas: Sequence[Mapping[str, Any]]) -> None:
        """Record counts and group sizes from each file's metadata, checked (a file
        without records is refused; a group size > 1 warned about)."""
        counts, group_sizes = [], []
        for path, meta in zip(self._paths, metas, strict=True):
            if meta["records"] == 0:
                raise ValueError(f"ArrayRecord file {path!r} has no records; remove it from paths")
            match = _GROUP_SIZE.search(meta["writer_options"])
            group_size = int(match.group(1)) if match else None
            if group_size is not None and group_size > 1:
                warnings.warn(
                    f"ArrayRecord file {path!r} was written with group_size={group_size}: "
                    f"random access decodes a whole group of {group_size} records for "
                    "every record read. Rewrite it with group_size=1 "
                    "(write_array_record does so by default) for fast random access.",
                    UserWarning,
                    stacklevel=4,
                )
            counts.append(int(meta["records"]))
            group_sizes.append(group_size)
        self._index = PartIndex(counts)
        self._group_sizes = tuple(group_sizes)

    def _init_remote(
        self,
        items: list[Any],
        storage_options: Mapping[str, Any] | None,
        options: _remote.RemoteOptions | None,
        index: Any,
    ) -> None:
        """Lists the URLs and reads each file's chunk index (or takes them from the metadata
        index), once, here: worker processes get them in the pickled source."""
        local = [p for p in items if not is_url(p)]
        if local:
            raise ValueError(
                f"paths mixes URLs and local paths (e.g. {local[0]!r}); read them as two "
                "sources and mix those, or give every file as a URL (file:///... for local)"
            )
        protocols = {p.split("://", 1)[0] for p in items}
        if len(protocols) > 1:
            raise ValueError(
                f"paths uses several stores ({', '.join(sorted(protocols))}); make one source "
                "per store and mix them"
            )
        if isinstance(options, Mapping):  # from a YAML config's options
            options = _remote.RemoteOptions(**options)
        options = options or _remote.RemoteOptions()
        if storage_options is not None:
            options = dataclasses.replace(options, storage_options=storage_options)
        self._remote_options = options
        if index is None and options.index_cache is not None:
            index = options.index_cache
        self._link = _remote.Link()

        def read(stats: list[FileStat]) -> list[dict[str, Any]]:
            files, self._link = _remote.load_files([(s.path, s.size) for s in stats], options)
            return [file.to_meta() for file in files]

        stats = received_stats(index, items)
        if stats is None:
            stats = stat_urls(items, what="ArrayRecord", example_glob="*.array_record",
                              storage_options=options.storage_options)
        metas = resolve(stats, "array_record", read, index, options.storage_options)
        files = [_remote.RemoteFile.from_meta(stat.path, meta) for stat, meta in zip(stats, metas)]
        self._remote_files = tuple(files)
        self._paths = tuple(f.url for f in files)
        self._set_files(metas)
        self._init_process_state()

    def _reset_handles(self) -> None:
        self._fetcher: _remote.RemoteFiles | None = None
        # One key a local file: readers of the same file with the same options are shared.
        self._keys = () if self._remote_files else tuple(
            ("array_record", path, self._options) for path in self._paths
        )

    def _close_handles(self) -> None:
        if self._fetcher is not None:
            self._fetcher.close()

    def _file_keys(self) -> tuple[tuple[str, str, str], ...]:
        return self._keys

    def _fetch_state(self) -> _remote.RemoteFiles:
        self._ensure_own_process()
        fetcher = self._fetcher
        if fetcher is None:
            with self._lock:
                if self._fetcher is None:
                    assert self._remote_options is not None
                    self._fetcher = _remote.RemoteFiles(
                        self._remote_files, self._remote_options, self._link,
                        lambda path: _open_reader(path, self._options),
                    )
                fetcher = self._fetcher
        return fetcher

    @property
    def takes_hints(self) -> bool:
        """Whether :meth:`prefetch` does anything: for URLs (``HintedDataSource``)."""
        return bool(self._remote_files)

    def prefetch(self, indices: Sequence[int] | np.ndarray) -> None:
        """Starts fetching the chunks of records that will be read soon (URLs only; a
        no-op for local files). Never blocks: at most a few calls are queued."""
        if not self._remote_files:
            return
        array = as_index_array(indices, self._index.total)
        files, positions = self._index.locate_many(array)
        self._fetch_state().prefetch(files, positions)

    @property
    def remote_stats(self) -> dict[str, int]:
        """For URLs: ranged requests made in this process (``prefetch_requests`` of
        them ahead of reads), bytes fetched, and the bytes of chunks cached now."""
        if not self._remote_files:
            return {}
        fetcher = self._fetch_state()
        return {
            "requests": fetcher.requests,
            "prefetch_requests": fetcher.prefetch_requests,
            "bytes_fetched": fetcher.bytes_fetched,
            "cached_bytes": fetcher.cached_bytes(),
        }

    @property
    def paths(self) -> tuple[str, ...]:
        """The files, in record order."""
        return self._paths

    @property
    def reader_options(self) -> dict[str, str]:
        """The reader options given (values as str); ``{}`` when none were."""
        return dict(self._reader_options)

    @property
    def num_records_per_file(self) -> tuple[int, ...]:
        """The number of records of each file, in the order of :attr:`paths`."""
        return tuple(self._index.counts.tolist())

    @property
    def group_sizes(self) -> tuple[int | None, ...]:
        """The group size each file was written with, in the order of :attr:`paths`.

        ``None`` where a file's writer options do not say.
        """
        return self._group_sizes

    def record_location(self, index: SupportsIndex) -> str:
        """Where record ``index`` lives: its file and its number in that file.

        Example:
            >>> source.record_location(2)  # doctest: +SKIP
            "file '/tmp/demo.array_record' (record 2 of its 3)"
        """
        file_index, position = self._index.locate(check_index(index, self._index.total))
        count = int(self._index.counts[file_index])
        return f"file {self._paths[file_index]!r} (record {position} of its {count})"

    def __len__(self) -> int:
        return self._index.total

    def __getitem__(self, index: SupportsIndex) -> bytes:
        i = check_index(index, self._index.total)
        if self._remote_files:
            return self.__getitems__(np.array([i], dtype=np.int64))[0]
        file_index, position = (0, i) if len(self._paths) == 1 else self._index.locate(i)
        key = self._keys[file_index]
        reader = OPEN_FILES.acquire(key, _open_key)
        try:
            return reader.read(position, position + 1)[0]
        finally:
            OPEN_FILES.release(key)

    def __getitems__(self, indices: Sequence[int] | np.ndarray) -> list[bytes]:
        """Returns the records at ``indices`` in the order given.

        Duplicates and any order are allowed. See the module docstring for why
        this is one ``read(i, i + 1)`` per record rather than one
        ``read(list)`` per file. The readers of the files touched are held (never
        closed by another thread) until the call returns.
        """
        if len(self._paths) == 1 and not self._remote_files:
            # The common case of a mixture's source: one file, a few records a call.
            wanted = as_index_list(indices, self._index.total)
            key = self._keys[0]
            read = OPEN_FILES.acquire(key, _open_key).read
            try:
                return [read(i, i + 1)[0] for i in wanted]
            finally:
                OPEN_FILES.release(key)
        array = as_index_array(indices, self._index.total)
        if self._remote_files:
            files, positions = self._index.locate_many(array)
            with self._fetch_state().hold(files, positions) as readers:
                file_list = files.tolist()
                reads = {f: readers[f].read for f in set(file_list)}
                pairs = zip(file_list, positions.tolist(), strict=True)
                return [reads[f](p, p + 1)[0] for f, p in pairs]
        keys = self._keys
        files, positions = self._index.locate_many(array)
        file_list = files.tolist()
        touched = list(set(file_list))
        with OPEN_FILES.hold([keys[f] for f in touched], _open_key) as readers:
            reads = {f: reader.read for f, reader in zip(touched, readers)}
            return [reads[f](p, p + 1)[0] for f, p in zip(file_list, positions.tolist(), strict=True)]

    def __repr__(self) -> str:
        options = f", reader_options={self._reader_options!r}" if self._reader_options else ""
        return (
            f"ArrayRecordDataSource(paths={format_paths(self._paths)}, "
            f"num_records={self._index.total}{options})"
        )

    def __eq__(self, other: object) -> bool:
        """Sources are equal when they read the same files with the same options."""
        if not isinstance(other, ArrayRecordDataSource):
            return NotImplemented
        return (self._paths, self._reader_options) == (other._paths, other._reader_options)

    def __hash__(self) -> int:
        return hash((self._paths, tuple(sorted(self._reader_options.items()))))
