"""ArrayRecord files in an object store, read by ranged requests.

Route. array_record's reader only opens local paths, and it must stay the one that
decodes records. So each remote file gets a local *sparse* stand-in of the same size
(:mod:`.cache`): its head and its index are written at their offsets, the reader opens
it, and before any read the byte ranges of the chunks that hold the records asked for
are fetched with ranged requests and written at their offsets. The reader then reads
them as from the real file. The chunk index (which records each chunk holds, where it
lies) is read once per file from its last bytes (:mod:`.chunk_index`), in the process
that builds the source, and travels to worker processes in the pickled source: workers
never read an index again. The head and index bytes are kept in ``cache_dir`` for the
workers' sparse files, so they do not fetch them either.

Fetching. One ``__getitems__`` call (a whole work unit) fetches every missing chunk of
its records at once: ranges of neighbouring chunks are coalesced (gaps smaller than what
the link moves in one request's latency are fetched too, see :data:`COALESCE_GAP`), and all
ranges of all files go out in one concurrent ``cat_ranges`` call (fsspec bounds its
concurrency). :meth:`RemoteFiles.prefetch` fetches the chunks of records to come in a
background thread, so a caller that knows the sampler's next positions hides the
latency entirely.

Whole file or ranges. A file is downloaded whole at its first read when that costs
about as much as a few requests: when ``size <= WHOLE_FILE_ROUND_TRIPS * latency *
bandwidth``, with the latency measured on the index requests and the bandwidth on the
larger fetches (100 MB/s until measured), and the file fits in a quarter of the cache.
``whole_file_bytes`` overrides the rule (0: never).
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import dataclasses
import hashlib
import os
import tempfile
import threading
import time
import zlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from ..files.handles import OPEN_FILES, check_limit
from . import urls
from .cache import Budget, SparseFile
from .chunk_index import BLOCK, ChunkIndex, NotAnIndexError, parse, tail_start

COALESCE_GAP = 64 << 10
"""Neighbouring ranges closer than this many bytes are always fetched as one; closer
than the bytes the link moves in one request's latency (``latency * bandwidth``, up to
:data:`MAX_RANGE` and an eighth of the cache) too: fetching the gap costs less than
another request."""

MAX_RANGE = 16 << 20
"""The largest single ranged request (a whole-file download is cut in such parts)."""

TAIL_GUESS = 256 << 10
"""Bytes read from a file's end to find its index in one request (a bigger index takes a second)."""

WHOLE_FILE_ROUND_TRIPS = 8
"""A file no bigger than this many round trips' worth of bytes is downloaded whole."""

_DEFAULT_BANDWIDTH = 100e6
_SIGNATURE = 64  # A block header and an empty chunk header open every Riegeli file.


@dataclasses.dataclass(frozen=True)
class RemoteOptions:
    """How ArrayRecord files given as URLs are read.

    Attributes:
        storage_options: Passed to the fsspec file system unchanged (``endpoint_url``,
            ``anon``, ``token``, ``client_kwargs``, ...); credentials are otherwise found
            by the store's client as usual.
        cache_dir: Where the sparse local files go (default: the temp dir's
            ``granary-remote``); put it on a local disk that can punch holes.
        cache_bytes: The most bytes of fetched chunks kept per process (index bytes
            aside); least recently used chunks are evicted first. Sources with the
            same ``cache_dir`` and ``cache_bytes`` in a process share one budget, so a
            mixture of many sources stays within it.
        whole_file_bytes: Download a file whole when it is at most this big; None
            decides by the measured rule (module docstring), 0 never.
        index_cache: A path or URL of the metadata index to use (and write) for these
            files (:mod:`~dataloader.sources.files.metadata_index`): each file's chunk index, and
            its head and tail bytes when small. Where it has every file, the source starts
            with one listing (to check that no file changed) and no other request; where
            it lacks some, they are read and added. The same as the source's ``index=``,
            which wins when both are given.
        retries: Attempts per request before a transient failure is an error.
        max_open_readers: When given, the most files the processes that read this source
            keep open, across sources (it sets ``dl.set_max_open_files`` there; None
            leaves the process's limit, 128 unless set). A reader holds its file's
            record offsets in memory; the least recently used is closed beyond the limit
            and reopened locally when needed again.
        fetch_ahead: Fetch the records of the units the loader computes next while it
            computes the current one (the loader passes them to ``prefetch``); False
            makes ``prefetch`` do nothing.
    """

    storage_options: Mapping[str, Any] | None = None
    cache_dir: str | None = None
    cache_bytes: int = 4 << 30
    whole_file_bytes: int | None = None
    index_cache: str | None = None
    retries: int = urls.RETRIES
    max_open_readers: int | None = None
    fetch_ahead: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.cache_bytes, bool) or not isinstance(self.cache_bytes, int) or self.cache_bytes < 0:
            raise ValueError(f"cache_bytes is {self.cache_bytes!r}; pass a byte count >= 0")
        if self.whole_file_bytes is not None and (
            isinstance(self.whole_file_bytes, bool)
            or not isinstance(self.whole_file_bytes, int)
            or self.whole_file_bytes < 0
        ):
            raise ValueError(
                f"whole_file_bytes is {self.whole_file_bytes!r}; pass a byte count >= 0, or "
                "None to decide by measurement"
            )
        if not isinstance(self.retries, int) or self.retries < 1:
            raise ValueError(f"retries is {self.retries!r}; pass a count >= 1")
        if self.max_open_readers is not None:
            check_limit(self.max_open_readers, "max_open_readers")
        if not isinstance(self.fetch_ahead, bool):
            raise ValueError(f"fetch_ahead is {self.fetch_ahead!r}; pass True or False")

    def directory(self) -> str:
        return self.cache_dir or os.path.join(tempfile.gettempdir(), "granary-remote")


@dataclasses.dataclass(frozen=True, eq=False)
class RemoteFile:
    """One remote ArrayRecord file as the source knows it (pickled to workers).

    Attributes:
        url: where it is.
        index: its chunk index.
        edges: its head and tail bytes (what the reader reads when it opens the file),
            compressed, when they are small enough to keep in the metadata index
            (:data:`EDGES_IN_INDEX`): a process given them never fetches them.
    """

    url: str
    index: ChunkIndex
    edges: bytes | None = None

    @property
    def key(self) -> str:
        """A file name for its cached bytes: the URL and size, hashed."""
        return hashlib.sha256(f"{self.url}\0{self.index.size}".encode()).hexdigest()[:32]

    def to_meta(self) -> dict[str, Any]:
        """Its entry in the metadata index."""
        meta = {"records": self.index.num_records, "writer_options": self.index.writer_options,
                "chunks": self.index.to_json()}
        if self.edges is not None:
            meta["edges"] = base64.b64encode(self.edges).decode("ascii")
        return meta

    @classmethod
    def from_meta(cls, url: str, meta: Mapping[str, Any]) -> RemoteFile:
        edges = meta.get("edges")
        return cls(url, ChunkIndex.from_json(meta["chunks"]),
                   None if edges is None else base64.b64decode(edges))


EDGES_IN_INDEX = 16 << 10
"""The most bytes of compressed head and tail a file keeps in the metadata index (a file
of a few thousand records; a larger index is fetched by each host that reads the file)."""


@dataclasses.dataclass
class Link:
    """Measured request latency and bandwidth, for the whole-file rule."""

    latency_s: float = 0.0
    bandwidth: float = _DEFAULT_BANDWIDTH

    def whole_file_limit(self) -> int:
        return int(WHOLE_FILE_ROUND_TRIPS * self.latency_s * self.bandwidth)


def _edges(index: ChunkIndex) -> tuple[tuple[int, int], tuple[int, int]]:
    """The head (before the first chunk) and the tail (index and postscript) ranges."""
    return (0, int(index.offsets[0])), (int(index.offsets[-1]), index.size)


def load_files(
    urls_and_sizes: Sequence[tuple[str, int]], options: RemoteOptions
) -> tuple[list[RemoteFile], Link]:
    """Reads the chunk index of every file: one concurrent request per file (two for an
    index larger than :data:`TAIL_GUESS`), and keeps each file's head and tail bytes in
    ``cache_dir`` for worker processes."""
    link = Link()
    if not urls_and_sizes:
        return [], link
    fs, _ = urls.filesystem(urls_and_sizes[0][0], options.storage_options)
    inner = {url: fs._strip_protocol(url) for url, _ in urls_and_sizes}
    url_of = {path: url for url, path in inner.items()}
    for url, size in urls_and_sizes:
        if size < BLOCK or size % BLOCK:
            raise ValueError(
                f"{url!r} ({size} bytes) is not an ArrayRecord file (its size is not a whole "
                "number of 64 KiB blocks); remove it from paths or rewrite it with "
                "write_array_record"
            )
    starts = [tail_start(size, TAIL_GUESS) for _, size in urls_and_sizes]
    # The first file alone first: its request time is the latency the whole-file rule uses.
    began = time.perf_counter()
    first = urls.fetch_ranges(
        fs, url_of, [inner[urls_and_sizes[0][0]]], starts[:1], [urls_and_sizes[0][1]],
        retries=options.retries,
    )
    link.latency_s = time.perf_counter() - began
    rest = urls.fetch_ranges(
        fs, url_of, [inner[u] for u, _ in urls_and_sizes[1:]], starts[1:],
        [s for _, s in urls_and_sizes[1:]], retries=options.retries,
    )
    files = []
    signature: bytes | None = None  # The first 64 bytes, the same in every Riegeli file.
    for (url, size), start, tail in zip(urls_and_sizes, starts, [*first, *rest], strict=True):
        try:
            index = _parse_or_refetch(fs, url, inner[url], url_of, tail, start, size, options)
        except NotAnIndexError as error:
            raise ValueError(
                f"{url!r} is not a readable ArrayRecord file ({error}); rewrite it with "
                "write_array_record"
            ) from None
        (head_start, head_end), (tail_from, _) = _edges(index)
        if head_start >= start:
            head = tail[head_start - start : head_end - start]
        elif head_end == len(signature or b""):
            head = signature  # type: ignore[assignment]
        else:
            head = urls.fetch_ranges(fs, url_of, [inner[url]], [head_start], [head_end])[0]
        if head_end == _SIGNATURE:
            signature = head
        whole_tail = tail[tail_from - start :] if tail_from >= start else None
        edges = None if whole_tail is None else _pack_edges(head, whole_tail)
        file = RemoteFile(url, index, edges if edges is not None and len(edges) <= EDGES_IN_INDEX else None)
        if edges is not None:
            _store_edges(options.directory(), file, edges)
        files.append(file)
    return files, link


def _parse_or_refetch(
    fs: Any, url: str, path: str, url_of: Mapping[str, str], tail: bytes, start: int,
    size: int, options: RemoteOptions,
) -> ChunkIndex:
    from .chunk_index import footer_offset

    footer = footer_offset(tail, size)
    if footer < start:  # An index larger than the guess: read it whole.
        tail = urls.fetch_ranges(fs, url_of, [path], [footer], [size], retries=options.retries)[0]
        start = footer
    return parse(tail, start, size)


def _edges_path(directory: str, file: RemoteFile) -> str:
    return os.path.join(directory, "index", file.key + ".edges")


def _pack_edges(head: bytes, tail: bytes) -> bytes:
    """Head and tail, compressed (zlib: the last block is mostly padding)."""
    return zlib.compress(len(head).to_bytes(8, "little") + head + tail, 1)


def _store_edges(directory: str, file: RemoteFile, edges: bytes) -> None:
    path = _edges_path(directory, file)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "wb") as out:
        out.write(edges)
    os.replace(temporary, path)


def _load_edges(directory: str, file: RemoteFile) -> tuple[bytes, bytes] | None:
    """The head and tail of ``file``: from the metadata index, else from ``directory``."""
    data = file.edges
    if data is None:
        try:
            with open(_edges_path(directory, file), "rb") as stored:
                data = stored.read()
        except OSError:
            return None
    try:
        data = zlib.decompress(data)
    except zlib.error:
        return None
    (_, head_end), (tail_from, size) = _edges(file.index)
    n = int.from_bytes(data[:8], "little")
    head, tail = data[8 : 8 + n], data[8 + n :]
    if len(head) != head_end or len(tail) != size - tail_from:
        return None
    return head, tail


class RemoteFiles:
    """The sparse files, readers and fetching of one process (never pickled).

    Args:
        files: The remote files, in the source's order.
        options: Cache and request settings.
        link: The latency and bandwidth measured where the indices were read.
        open_reader: Opens array_record's reader on a local path.
    """

    def __init__(
        self, files: Sequence[RemoteFile], options: RemoteOptions, link: Link, open_reader: Any
    ) -> None:
        self._files = list(files)
        self._options = options
        self._link = dataclasses.replace(link)
        self._open_reader = open_reader
        self._fs, _ = urls.filesystem(files[0].url, options.storage_options)
        self._paths = [self._fs._strip_protocol(f.url) for f in files]
        self._url_of = dict(zip(self._paths, (f.url for f in files), strict=True))
        self._sparse: list[SparseFile | None] = [None] * len(files)
        if options.max_open_readers is not None:
            OPEN_FILES.set_limit(options.max_open_readers)
        self._budget = _shared_budget(options.directory(), options.cache_bytes)
        self._lock = threading.RLock()
        self._prefetcher: concurrent.futures.ThreadPoolExecutor | None = None
        self._pending: list[concurrent.futures.Future[None]] = []
        # Chunks being fetched, by file: chunk -> the event set when its fetch ends.
        self._inflight: dict[int, dict[int, threading.Event]] = {}
        self.requests = 0
        self.prefetch_requests = 0  # Of the requests, those made ahead of a read.
        self.bytes_fetched = 0

    # -- reading ---------------------------------------------------------------

    @contextlib.contextmanager
    def hold(self, files: np.ndarray, positions: np.ndarray) -> Iterator[dict[int, Any]]:
        """Makes the chunks of these records present and pinned while the block runs;
        yields their files' readers, which stay open until it ends."""
        keys = self._fetch(files, positions, keep_pinned=True)
        try:
            touched = np.unique(files).tolist()
            with OPEN_FILES.hold([self._reader_key(f) for f in touched], self._open_key) as readers:
                yield dict(zip(touched, readers, strict=True))
        finally:
            self._budget.unpin(keys)

    def _reader_key(self, f: int) -> tuple[str, str]:
        """File ``f``'s reader in the shared cache of open files (over its sparse file)."""
        with self._lock:
            return ("remote_array_record", self._sparse_file(f).path)

    def _open_key(self, key: tuple[str, str]) -> Any:
        return self._open_reader(key[1])

    def prefetch(self, files: np.ndarray, positions: np.ndarray) -> None:
        """Fetches these records' chunks in the background (for records to come)."""
        with self._lock:
            if self._prefetcher is None:
                self._prefetcher = concurrent.futures.ThreadPoolExecutor(1, "granary-prefetch")
            self._pending = [f for f in self._pending if not f.done()]
            if not self._options.fetch_ahead or len(self._pending) >= 4:  # A few units ahead at most.
                return
            self._pending.append(self._prefetcher.submit(self._prefetch, files, positions))

    def _prefetch(self, files: np.ndarray, positions: np.ndarray) -> None:
        with contextlib.suppress(Exception):  # A real read retries and reports.
            self._fetch(files, positions, keep_pinned=False, ahead=True)

    def _fetch(
        self, files: np.ndarray, positions: np.ndarray, *, keep_pinned: bool, ahead: bool = False
    ) -> list[tuple[SparseFile, int]]:
        """Fetches the missing chunks of these records; their keys stay pinned if asked.

        Planning and bookkeeping happen under the locks (this process's, then the
        budget's, which other sources may share: a chunk is pinned before it is found
        present, so no eviction takes it in between); the requests do not, so a
        prefetch and a read fetch at the same time. A chunk another call is fetching is
        waited for, not fetched twice.
        """
        keys: list[tuple[SparseFile, int]] = []
        try:
            while True:
                with self._lock, self._budget.lock:
                    plan, waits = self._plan(files, positions, keys)
                if plan is not None:
                    self._run(plan, ahead)
                for event in waits:
                    event.wait()
                if plan is None and not waits:
                    break
        except BaseException:
            self._budget.unpin(keys)
            raise
        if not keep_pinned:
            self._budget.unpin(keys)
        return keys

    def _plan(
        self, files: np.ndarray, positions: np.ndarray, keys: list[tuple[SparseFile, int]]
    ) -> tuple[_Plan | None, list[threading.Event]]:
        """The ranges to fetch now and the fetches of others to wait for (pins on the first call)."""
        plan = _Plan()
        waits: list[threading.Event] = []
        pin = not keys
        for f in np.unique(files).tolist():
            sparse = self._sparse_file(f)
            index = self._files[f].index
            chunks = np.unique(index.chunks_of(positions[files == f]))
            if pin:
                wanted = [(sparse, c) for c in chunks.tolist()]
                self._budget.pin(wanted)  # From here on no eviction can take them.
                keys.extend(wanted)
            for c in chunks.tolist():
                self._budget.touch(sparse, c)
            present = np.frombuffer(sparse.present, dtype=np.uint8)
            if not present.any() and not self._inflight.get(f) and self._whole(index.size):
                chunks = np.arange(index.num_chunks)
            absent = chunks[present[chunks] == 0]
            flying = self._inflight.setdefault(f, {})
            waits.extend({id(flying[c]): flying[c] for c in absent.tolist() if c in flying}.values())
            missing = np.array([c for c in absent.tolist() if c not in flying], dtype=np.int64)
            for first, last in _coalesce(index.offsets, missing, flying, self._gap()):
                event = threading.Event()
                for c in range(first, last):
                    flying[c] = event
                for start in range(int(index.offsets[first]), int(index.offsets[last]), MAX_RANGE):
                    plan.ranges.append((f, start, min(start + MAX_RANGE, int(index.offsets[last]))))
                plan.spans.append((f, first, last, event))
        return (plan if plan.spans else None), waits

    def _run(self, plan: _Plan, ahead: bool = False) -> None:
        """Fetches a plan's ranges (no lock held) and files them."""
        data: list[bytes] | None = None
        try:
            began = time.perf_counter()
            data = urls.fetch_ranges(
                self._fs, self._url_of, [self._paths[f] for f, _, _ in plan.ranges],
                [start for _, start, _ in plan.ranges], [end for _, _, end in plan.ranges],
                retries=self._options.retries,
            )
            elapsed = time.perf_counter() - began
        finally:
            with self._lock, self._budget.lock:
                if data is not None:
                    self._measure(sum(len(d) for d in data), elapsed)
                    self.requests += len(plan.ranges)
                    self.prefetch_requests += len(plan.ranges) if ahead else 0
                    for (f, start, _), piece in zip(plan.ranges, data, strict=True):
                        self._sparse_file(f).write(start, piece)
                for f, first, last, event in plan.spans:
                    sparse = self._sparse_file(f)
                    for c in range(first, last):
                        self._inflight[f].pop(c, None)
                        if data is not None and not sparse.present[c]:
                            sparse.present[c] = 1
                            self._budget.add(sparse, c, sparse.offsets[c + 1] - sparse.offsets[c])
                    event.set()  # A failed fetch wakes its waiters too: they try themselves.
                self._budget.make_room()

    def _gap(self) -> int:
        by_link = int(self._link.latency_s * self._link.bandwidth)
        return max(COALESCE_GAP, min(by_link, MAX_RANGE, self._options.cache_bytes // 8))

    def _whole(self, size: int) -> bool:
        if size > self._options.cache_bytes // 4:
            return False
        if self._options.whole_file_bytes is not None:
            return size <= self._options.whole_file_bytes
        return size <= self._link.whole_file_limit()

    def _measure(self, nbytes: int, seconds: float) -> None:
        self.bytes_fetched += nbytes
        if nbytes >= 1 << 20 and seconds > self._link.latency_s:
            measured = nbytes / (seconds - self._link.latency_s)
            self._link.bandwidth = 0.5 * self._link.bandwidth + 0.5 * measured

    def _sparse_file(self, f: int) -> SparseFile:
        sparse = self._sparse[f]
        if sparse is not None:
            return sparse
        file = self._files[f]
        directory = self._options.directory()
        if not os.path.isdir(directory):
            os.makedirs(directory, exist_ok=True)
        _remove_orphans(directory)
        edges = _load_edges(directory, file)
        (head_start, head_end), (tail_from, size) = _edges(file.index)
        if edges is None:
            head, tail = urls.fetch_ranges(
                self._fs, self._url_of, [self._paths[f]] * 2, [head_start, tail_from],
                [head_end, size], retries=self._options.retries,
            )
            self.requests += 2
        else:
            head, tail = edges
        sparse = SparseFile(
            os.path.join(directory, f"{file.key}.{os.getpid()}.{id(self):x}.array_record"),
            size, file.index.offsets.tolist(),
        )
        sparse.write(head_start, head)
        sparse.write(tail_from, tail)
        self._sparse[f] = sparse
        return sparse

    def cached_bytes(self) -> int:
        """Disk bytes the chunks fetched take now (holes and index bytes aside)."""
        return self._budget.used

    def close(self) -> None:
        if self._prefetcher is not None:
            self._prefetcher.shutdown(wait=True, cancel_futures=True)
            self._prefetcher = None
        for i, sparse in enumerate(self._sparse):
            if sparse is not None:
                OPEN_FILES.close([("remote_array_record", sparse.path)])
                with self._budget.lock:
                    self._budget.forget(sparse)
                sparse.close()
                self._sparse[i] = None


_SWEPT: set[tuple[int, str]] = set()


def _remove_orphans(directory: str) -> None:
    """Removes sparse files of processes that are gone (a worker ended without cleaning
    up); once per directory and process."""
    if (os.getpid(), directory) in _SWEPT:
        return
    _SWEPT.add((os.getpid(), directory))
    for name in os.listdir(directory):
        parts = name.split(".")
        if len(parts) != 4 or parts[3] != "array_record" or not parts[1].isdigit():
            continue
        try:
            os.kill(int(parts[1]), 0)
        except ProcessLookupError:
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(directory, name))
        except PermissionError:  # alive, another user's
            pass


_BUDGETS: dict[str, Budget] = {}
_BUDGETS_LOCK = threading.Lock()


def _shared_budget(directory: str, limit: int) -> Budget:
    """The budget of ``directory`` in this process (a fork starts afresh)."""
    key = f"{os.getpid()}:{os.path.abspath(directory)}:{limit}"
    with _BUDGETS_LOCK:
        budget = _BUDGETS.get(key)
        if budget is None:
            budget = _BUDGETS[key] = Budget(limit)
        return budget


@dataclasses.dataclass
class _Plan:
    """What one call fetches: ranges ``(file, start, end)``, and the chunk runs they fill."""

    ranges: list[tuple[int, int, int]] = dataclasses.field(default_factory=list)
    spans: list[tuple[int, int, int, threading.Event]] = dataclasses.field(default_factory=list)


def _coalesce(
    offsets: np.ndarray, chunks: np.ndarray, flying: Mapping[int, Any], gap: int
) -> list[tuple[int, int]]:
    """Runs ``[first, last)`` of chunks to fetch, neighbours closer than ``gap`` bytes
    joined (never across a chunk another call is fetching)."""
    runs: list[tuple[int, int]] = []
    for c in np.sort(chunks).tolist():
        if (
            runs
            and offsets[c] - offsets[runs[-1][1]] < gap
            and offsets[c + 1] - offsets[runs[-1][0]] <= MAX_RANGE
            and not any(g in flying for g in range(runs[-1][1], c))
        ):
            runs[-1] = (runs[-1][0], c + 1)
        else:
            runs.append((c, c + 1))
    return runs
