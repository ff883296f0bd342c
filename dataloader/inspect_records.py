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
import re
import warnings
from collections.abc import Sequence

from array_record.python.array_record_module import ArrayRecordReader

from dataloader.convert import expand_inputs
from sources import ArrayRecordDataSource

_GROUP_SIZE = re.compile(r"(?:^|,)group_size:(\d+)(?:,|$)")


def group_size(path: str) -> int | None:
    """The group size a file was written with (``None`` when it does not say)."""
    reader = ArrayRecordReader(path, "readahead_buffer_size:0")
    try:
        match = _GROUP_SIZE.search(reader.writer_options_string() or "")
    finally:
        reader.close()
    return int(match.group(1)) if match else None


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
        ValueError: a file is not ArrayRecord (from :class:`ArrayRecordDataSource`).
        IndexError: ``index`` is out of range.
    """
    files = expand_inputs(patterns)
    with warnings.catch_warnings():  # a group size > 1 is reported below instead
        warnings.simplefilter("ignore", UserWarning)
        source = ArrayRecordDataSource(files)
    lines = [f"{len(source.paths)} file(s), {len(source):,} records"]
    for path, count in zip(source.paths, source.num_records_per_file, strict=True):
        size = os.path.getsize(path)
        group = group_size(path)
        lines.append(
            f"  {path}  {count:,} records  group size {group if group is not None else '?'}  "
            f"{size / 1024:,.1f} KiB"
        )
    if not -len(source) <= index < len(source):
        raise IndexError(f"record index {index} is out of range for {len(source):,} records")
    record = source[index % len(source)]
    lines.append(f"record {index % len(source)} ({len(record):,} bytes): {preview(record)}")
    return "\n".join(lines)
