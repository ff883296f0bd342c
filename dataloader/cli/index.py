"""``python -m dataloader index PATHS``: the metadata index, built ahead of a job.

Reads what every source needs from each file (see :mod:`dataloader.sources.files.metadata_index`)
and writes it to the index beside the data (one ``_granary_index.json`` in each directory)
or to ``--index_path`` (a path or URL). Every file named is read again, so the command
also rebuilds entries that went stale. The format is told from each file's extension
(``.array_record``, ``.parquet``, ``.tfrecord``, ``.jsonl`` / ``.json``; shard suffixes
such as ``-00000-of-00016`` are allowed) or given with ``--kind``.

Example:
    >>> print(build_index(["data/train-*.array_record"]))  # doctest: +SKIP
    indexed 1,024 files (array_record 1,024) into data/_granary_index.json in 3.1 s
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dataloader.beam.record_files import split_name
from dataloader.sources import expand_paths
from dataloader.sources.files.metadata_index import INDEX_NAME, FileStat, MetadataIndex, stat_local
from dataloader.sources.remote import is_url

KINDS = ("array_record", "parquet", "tfrecord", "jsonl")
_EXTENSIONS = {".parquet": "parquet", ".tfrecord": "tfrecord", ".tfrecords": "tfrecord",
               ".jsonl": "jsonl", ".json": "jsonl"}
_ARRAY_RECORD = re.compile(r"\.array_?record(-\d+-of-\d+)?$", re.IGNORECASE)


def file_kind(path: str, kind: str | None = None) -> str:
    """``kind``, or the format the name of ``path`` says.

    Raises:
        ValueError: an unknown ``kind`` or extension, or a gzip file (not indexable).
    """
    if kind is not None:
        if kind not in KINDS:
            raise ValueError(f"--kind {kind!r} is not one of {', '.join(KINDS)}")
    elif _ARRAY_RECORD.search(path):
        kind = "array_record"
    else:
        kind = _EXTENSIONS.get(split_name(path).extension)
        if kind is None:
            raise ValueError(
                f"cannot tell the format of {path!r} from its extension; name it with "
                f"--kind ({', '.join(KINDS)})"
            )
    if split_name(path).gzip:
        raise ValueError(
            f"{path!r} is gzip: its records cannot be read from an offset, so it has no "
            "index; decompress it, or convert it to ArrayRecord"
        )
    return kind


def _readers(storage_options: Mapping[str, Any] | None) -> dict[str, Callable[[list[FileStat]], list[dict[str, Any]]]]:
    from dataloader.sources import array_record, jsonl, parquet, remote, tfrecord

    options = remote.RemoteOptions(storage_options=storage_options)
    return {
        "array_record": lambda stats: array_record.read_metadata(stats, remote=options),
        "parquet": lambda stats: parquet.read_metadata(stats, storage_options),
        "tfrecord": tfrecord.index.read_metadata,
        "jsonl": lambda stats: jsonl.read_metadata(stats, storage_options),
    }


def _stats(patterns: Sequence[str], storage_options: Mapping[str, Any] | None) -> list[FileStat]:
    """The files the patterns name (one listing a URL glob), the index files left out."""
    from dataloader.sources.remote.urls import stat_urls

    stats: list[FileStat] = []
    for pattern in patterns:
        if is_url(pattern):
            stats += stat_urls([pattern], what="data", example_glob="*.array_record",
                               storage_options=storage_options)
        else:
            stats += [stat_local(p) for p in expand_paths(pattern, what="data", example_glob="*.array_record")]
    return [s for s in stats if os.path.basename(s.path) != INDEX_NAME]


def build_index(
    patterns: Sequence[str],
    index_path: str | None = None,
    kind: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> str:
    """Indexes the files ``patterns`` name; returns a one-paragraph report.

    Args:
        patterns: paths, globs or URLs of data files (one format each, or several).
        index_path: the index file to write; None: the one beside each file.
        kind: the files' format; None: by extension.
        storage_options: for URLs, passed to the fsspec file system.

    Raises:
        FileNotFoundError: a pattern matches nothing.
        ValueError: a file's format is unknown, it is gzip, or it cannot be read.
    """
    began = time.perf_counter()
    stats = _stats(patterns, storage_options)
    if any(is_url(s.path) and file_kind(s.path, kind) == "tfrecord" for s in stats):
        raise ValueError("TFRecord files are indexed where they are read by offset: local files only")
    groups: dict[tuple[str, str], list[FileStat]] = {}
    for stat in stats:
        where = index_path or (stat.path.rsplit("/", 1)[0] + "/" + INDEX_NAME if is_url(stat.path)
                               else os.path.join(os.path.dirname(stat.path), INDEX_NAME))
        groups.setdefault((where, file_kind(stat.path, kind)), []).append(stat)
    readers = _readers(storage_options)
    indexes: dict[str, MetadataIndex] = {}
    for (where, what), group in groups.items():
        index = indexes.setdefault(where, MetadataIndex(where, storage_options))
        for stat, meta in zip(group, readers[what](group), strict=True):
            index.add(stat, what, meta)
    for index in indexes.values():
        index.save()
    kinds: dict[str, int] = {}
    for (_, what), group in groups.items():
        kinds[what] = kinds.get(what, 0) + len(group)
    counted = ", ".join(f"{k} {n:,}" for k, n in sorted(kinds.items()))
    into = ", ".join(sorted(indexes))
    return f"indexed {len(stats):,} files ({counted}) into {into} in {time.perf_counter() - began:.1f} s"


def parse_storage_options(text: str | None) -> dict[str, Any] | None:
    """``--storage_options`` as a dict (JSON text), None when not given."""
    if not text:
        return None
    try:
        options = json.loads(text)
    except ValueError as error:
        raise ValueError(f"--storage_options is not JSON ({error}): pass e.g. '{{\"anon\": true}}'") from None
    if not isinstance(options, dict):
        raise ValueError(f"--storage_options must be a JSON object, got {text!r}")
    return options
