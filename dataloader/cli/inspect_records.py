"""What ArrayRecord data holds: files, records, group sizes and a sample record.

Example:
    >>> print(describe_array_records(["data/train-*.array_record"]))  # doctest: +SKIP
    2 files, 1,500 records
      data/train-00000-of-00002.array_record  750 records  group size 1  49.3 KB
      ...
    record 0 (65 bytes): b'\\x03\\x00\\x00\\x05\\r\\x0f...'
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Sequence

from dataloader.sources import ArrayRecordDataSource


def preview(record: bytes, limit: int = 200) -> str:
    """A readable rendering: JSON or text when the record is that, else its bytes."""
    try:
        text = record.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and text.isprintable():
        try:
            return "JSON " + json.dumps(json.loads(text))[:limit]
        except ValueError:
            return "text " + repr(text[:limit])
    if record.startswith(b"\x93NUMPY"):
        return "numpy .npy " + repr(record[:limit])
    if record.startswith(b"PK\x03\x04"):
        return "numpy .npz (zip) " + repr(record[:limit])
    return repr(record[:limit]) + (" ..." if len(record) > limit else "")


def describe_array_records(patterns: Sequence[str], index: int = 0) -> str:
    """A report of the files ``patterns`` match and of record ``index``.

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
        lines.append(
            f"  {path}  {count:,} records  group size {group if group is not None else '?'}  "
            f"{size / 1024:,.1f} KiB"
        )
    if not -len(source) <= index < len(source):
        raise IndexError(f"record index {index} is out of range for {len(source):,} records")
    record = source[index % len(source)]
    lines.append(f"record {index % len(source)} ({len(record):,} bytes): {preview(record)}")
    return "\n".join(lines)
