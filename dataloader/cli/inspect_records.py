"""What ArrayRecord data holds: files, records, group sizes and a few records, decoded.

Example:
    >>> print(describe_array_records(["data/train-*.array_record"], records=2))  # doctest: +SKIP
    2 file(s), 1,000 records
      data/train-00000-of-00002.array_record  500 records  group size 1  49.3 KiB
      ...
    record 0 (16 bytes): bytes b'\\x00\\x00...'
    record 1 (16 bytes): bytes b'\\x01\\x00...'
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from dataloader.cli.decode import describe_record, describe_value
from dataloader.sources import ArrayRecordDataSource


def describe_array_records(
    patterns: Sequence[str], index: int = 0, records: int = 1, decode: Callable[[bytes], Any] | None = None
) -> str:
    """A report of the files ``patterns`` match and of ``records`` records from ``index``.

    Args:
        patterns: paths or globs of ArrayRecord files.
        index: the first record to show (negative: from the end).
        records: how many records to show (fewer at the end).
        decode: a function of a record (the pipeline's first map, say); its result is
            shown (arrays as shape and dtype) beside what the bytes look like, or the
            exception it raised: one bad record does not hide the others.

    Raises:
        FileNotFoundError: a pattern matches nothing.
        ValueError: a path is a directory or a file is not ArrayRecord (from
            :class:`ArrayRecordDataSource`).
        IndexError: ``index`` is out of range.
    """
    with warnings.catch_warnings():  # a group size > 1 is reported below instead
        warnings.simplefilter("ignore", UserWarning)
        source = ArrayRecordDataSource(list(patterns))
    lines = [f"{len(source.paths)} file(s), {len(source):,} records"]
    files = zip(source.paths, source.num_records_per_file, source.group_sizes, strict=True)
    for path, count, group in files:
        size = os.path.getsize(path)
        note = "  (random access decodes a whole group per record)" if group is not None and group > 1 else ""
        lines.append(
            f"  {path}  {count:,} records  group size {group if group is not None else '?'}  "
            f"{size / 1024:,.1f} KiB{note}"
        )
    if not -len(source) <= index < len(source):
        raise IndexError(f"record index {index} is out of range for {len(source):,} records")
    first = index % len(source)
    for i in range(first, min(len(source), first + records)):
        record = source[i]
        lines.append(f"record {i} ({len(record):,} bytes): {describe_record(record)}")
        if decode is not None:
            lines.append(f"  decoded: {_decoded(decode, record)}")
    return "\n".join(lines)


def _decoded(decode: Callable[[bytes], Any], record: bytes) -> str:
    try:
        return describe_value(decode(record))
    except Exception as error:  # the user's function on foreign data: report, go on
        return f"failed: {type(error).__name__}: {error}"[:400]
