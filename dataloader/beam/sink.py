"""Writing ArrayRecord shards atomically, the way Beam's file sinks do, and ``WriteToArrayRecord``.

Every shard is first written under a hidden staging folder beside the output
(``out/.train.<run id>.staging/``); only when every shard of the run is complete does
one finalize step move them to their names (deleting, with ``overwrite``, whatever
``PREFIX-*.array_record`` held before). A failed run therefore leaves the previous
output untouched and no partial shard under an output name; the staging folder is
removed by the converter's driver, and by the finalize step of ``WriteToArrayRecord``.

Each shard's writer also computes a checksum of what it wrote (BLAKE2b over each
record's length and bytes, in order), which ``--verify`` compares with what it reads
back.

The ArrayRecord writer writes local files only, so a shard bound for another file
system (``gs://...``) is written to a local temporary file on the worker and copied.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import struct
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from dataloader.beam.files import check_prefix, existing_outputs, is_local
from dataloader.beam.plan import refusal, shard_path
from dataloader.errors import ConvertError
from dataloader.sources import write_array_record


@dataclass(frozen=True)
class ShardResult:
    """What one shard writer wrote: final path, staged path, record count and checksum."""

    index: int
    path: str
    staged: str
    count: int
    checksum: str


def parse_writer_options(options: str) -> tuple[int, str]:
    """``"group_size:1,zstd:3"`` -> ``(1, "zstd:3")``; group_size defaults to 1.

    Raises:
        ValueError: the group size is not a positive integer.
    """
    group_size, rest = 1, []
    for item in filter(None, (part.strip() for part in options.split(","))):
        name, _, value = item.partition(":")
        if name == "group_size":
            if not value.isdigit() or int(value) < 1:
                raise ValueError(f"writer_options {options!r}: group_size must be a positive integer")
            group_size = int(value)
        else:
            rest.append(item)
    return group_size, ",".join(rest)


def check_writer_options(options: str) -> None:
    """Refuses options the ArrayRecord writer does not take, before any worker starts.

    Raises:
        ValueError: naming the options and the writer's complaint.
    """
    group_size, rest = parse_writer_options(options)
    with tempfile.TemporaryDirectory() as folder:
        write_array_record(os.path.join(folder, "check"), [], group_size=group_size, options=rest or None)


class Checksum:
    """BLAKE2b of a record stream (each record's length, then its bytes), and its count."""

    def __init__(self) -> None:
        self._hash = hashlib.blake2b(digest_size=16)
        self.count = 0

    def add(self, record: bytes) -> None:
        self._hash.update(struct.pack("<Q", len(record)))
        self._hash.update(record)
        self.count += 1

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


@dataclass(frozen=True)
class Staging:
    """The hidden folder where one run stages its shards, beside the output prefix."""

    prefix: str
    run_id: str

    @property
    def folder(self) -> str:
        head, base = os.path.split(self.prefix) if is_local(self.prefix) else self.prefix.rsplit("/", 1)
        return FileSystems.join(head or ".", f".{base}.{self.run_id}.staging")

    def staged(self, final_path: str) -> str:
        return FileSystems.join(self.folder, os.path.basename(final_path))

    def progress_file(self, index: int) -> str | None:
        """Where a local shard writer reports its count as it goes (None when remote)."""
        return os.path.join(self.folder, f"progress-{index:05d}") if is_local(self.prefix) else None

    def total_file(self) -> str | None:
        """Where the plan step leaves the number of records to write (None when remote)."""
        return os.path.join(self.folder, "total") if is_local(self.prefix) else None

    def create(self) -> None:
        if is_local(self.prefix):
            os.makedirs(self.folder, exist_ok=True)

    def remove(self) -> None:
        with contextlib.suppress(Exception):  # cleanup must not hide the run's own error
            if FileSystems.exists(self.folder):
                FileSystems.delete([self.folder])


def report(path: str | None, count: int) -> None:
    """Writes ``count`` to a progress file, atomically (the driver polls it)."""
    if path is not None:
        with open(path + ".tmp", "w") as f:
            f.write(str(count))
        os.replace(path + ".tmp", path)


def write_shard(staging: Staging, index: int, final_path: str, records: Iterable[bytes],
                writer_options: str) -> ShardResult:
    """Writes ``records`` as the staged copy of ``final_path``; returns what it wrote."""
    group_size, options = parse_writer_options(writer_options)
    checksum, progress = Checksum(), staging.progress_file(index)
    last_report = time.monotonic()

    def counted() -> Iterator[bytes]:
        nonlocal last_report
        for record in records:
            checksum.add(record)
            if progress is not None and time.monotonic() - last_report > 0.5:
                report(progress, checksum.count)
                last_report = time.monotonic()
            yield record

    staged = staging.staged(final_path)
    if is_local(staged):
        staging.create()
        write_array_record(staged, counted(), group_size=group_size, options=options or None)
    else:
        with tempfile.TemporaryDirectory() as local:
            local_file = os.path.join(local, "shard" + ".array_record")
            write_array_record(local_file, counted(), group_size=group_size, options=options or None)
            with open(local_file, "rb") as src, FileSystems.create(staged) as dst:
                shutil.copyfileobj(src, dst, 1 << 22)
    report(progress, checksum.count)
    return ShardResult(index, final_path, staged, checksum.count, checksum.hexdigest())


def finalize(staging: Staging, results: list[ShardResult], expected: int, overwrite: bool) -> list[ShardResult]:
    """Moves every staged shard to its name at once (the commit of a run).

    Raises:
        ConvertError: a shard is missing, or the output exists and ``overwrite`` is off.
    """
    results = sorted(results, key=lambda r: r.index)
    if [r.index for r in results] != list(range(expected)):
        raise ConvertError(f"expected {expected} shards, got {[r.index for r in results]}")
    old = existing_outputs(staging.prefix)
    if old and not overwrite:
        raise ConvertError(refusal(old))
    if old:
        FileSystems.delete(old)
    FileSystems.rename([r.staged for r in results], [r.path for r in results])
    return results


def write_summary(staging: Staging, results: list[ShardResult]) -> None:
    with FileSystems.create(FileSystems.join(staging.folder, "summary.json")) as f:
        f.write(json.dumps([asdict(r) for r in results]).encode())


def read_summary(staging: Staging) -> list[ShardResult]:
    with FileSystems.open(FileSystems.join(staging.folder, "summary.json")) as f:
        return [ShardResult(**item) for item in json.loads(f.read())]


# WriteToArrayRecord: a sink for any PCollection of records ----------------------------


def _shard_of(key: Any, num_shards: int) -> int:
    data = key if isinstance(key, bytes) else repr(key).encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") % num_shards


def _keyed(element: Any, num_shards: int) -> tuple[int, tuple[Any, bytes]]:
    if isinstance(element, tuple) and len(element) == 2 and isinstance(element[1], bytes):
        key, record = element
    elif isinstance(element, bytes):
        key, record = element, element
    else:
        raise ConvertError(
            f"WriteToArrayRecord takes bytes or (key, bytes) elements, got {type(element).__name__}"
        )
    return _shard_of(key, num_shards), (key, record)


class _WriteGroup(beam.DoFn):
    def __init__(self, staging: Staging, num_shards: int, writer_options: str) -> None:
        self.staging, self.num_shards, self.writer_options = staging, num_shards, writer_options

    def process(self, element: tuple[int, Iterable[tuple[Any, bytes]]]) -> Iterator[ShardResult]:
        shard, values = element
        records = (record for _, record in sorted(values, key=lambda kv: (kv[0], kv[1])))
        path = shard_path(self.staging.prefix, shard, self.num_shards)
        yield write_shard(self.staging, shard, path, records, self.writer_options)


class _Commit(beam.DoFn):
    """Fills empty shards, then finalizes and removes the staging folder."""

    def __init__(self, staging: Staging, num_shards: int, writer_options: str, overwrite: bool) -> None:
        self.staging, self.num_shards = staging, num_shards
        self.writer_options, self.overwrite = writer_options, overwrite

    def process(self, results: list[ShardResult]) -> Iterator[list[ShardResult]]:
        done = {r.index for r in results}
        results = list(results) + [
            write_shard(self.staging, i, shard_path(self.staging.prefix, i, self.num_shards), [],
                        self.writer_options)
            for i in range(self.num_shards) if i not in done
        ]
        try:
            yield finalize(self.staging, results, self.num_shards, self.overwrite)
        finally:
            self.staging.remove()


class WriteToArrayRecord(beam.PTransform):
    """Writes a PCollection of records as ``num_shards`` ArrayRecord files, atomically.

    Elements are ``bytes`` or ``(key, bytes)``. A record's shard is a hash of its key
    (of the record itself when there is none) and each shard is sorted by key, then by
    the record's bytes, so the files do not depend on the runner, the worker count or
    the order in which elements arrive. Give keys that say the order you want (for
    example ``(file index, record index)``, what ``ReadRecordFiles`` yields). A shard is
    sorted in one worker's memory; pick ``num_shards`` so that a shard fits (a few
    hundred MB). Shards that receive no record are written empty, so the set
    ``PREFIX-0000i-of-0000N.array_record`` is always complete (an empty file cannot be
    read by ``ArrayRecordDataSource``; use fewer shards than records).

    Shards are staged under a hidden folder and renamed into place only once all are
    written; existing ``PREFIX-*.array_record`` files are refused unless ``overwrite``,
    and then all of them are replaced. The output is a one-element PCollection: the
    list of :class:`ShardResult`.

    Args:
        prefix: the output's path prefix (``out/train`` or ``gs://bucket/out/train``).
        num_shards: how many files to write.
        writer_options: ArrayRecord writer options; ``group_size:1`` (the default)
            gives fast random access.
        overwrite: replace an existing output instead of refusing it.

    Example:
        >>> with beam.Pipeline() as p:  # doctest: +SKIP
        ...     _ = p | beam.Create([b"a", b"b"]) | WriteToArrayRecord("out/ab", num_shards=1)
    """

    def __init__(self, prefix: str, num_shards: int = 1, writer_options: str = "group_size:1",
                 overwrite: bool = False) -> None:
        super().__init__()
        if isinstance(num_shards, bool) or not isinstance(num_shards, int) or num_shards < 1:
            raise ValueError(f"num_shards must be a positive integer, got {num_shards!r}")
        check_writer_options(writer_options)
        self.staging = Staging(check_prefix(prefix), os.urandom(6).hex())
        self.num_shards, self.writer_options, self.overwrite = num_shards, writer_options, overwrite
        existing = existing_outputs(prefix)
        if existing and not overwrite:
            raise ConvertError(refusal(existing))

    def expand(self, pcoll: Any) -> Any:
        return (
            pcoll
            | "Shard" >> beam.Map(_keyed, self.num_shards)
            | "Group" >> beam.GroupByKey()
            | "Write" >> beam.ParDo(_WriteGroup(self.staging, self.num_shards, self.writer_options))
            | "Collect" >> beam.combiners.ToList()
            | "Commit" >> beam.ParDo(_Commit(self.staging, self.num_shards, self.writer_options,
                                             self.overwrite))
        )
