"""Converting Parquet, JSON lines and numpy files to ArrayRecord shards.

Each input record becomes one ArrayRecord record (bytes), in input order (files in
the order given, globs sorted), cut into ``num_shards`` contiguous shards named
``<prefix>-00000-of-0000N.array_record``, written with ``group_size=1`` by default
(what random access wants; see :func:`sources.write_array_record`). How records are
encoded, and how to read them back in a ``map``:

============  ===========================================  ==================================
input         one record is                                decode with
============  ===========================================  ==================================
``.jsonl``    the line's UTF-8 text (checked to be JSON)   ``json.loads(record)``
``.parquet``  the row as a JSON object (lists for list     ``json.loads(record)``
              columns, base64 text for binary columns)
``.npy``      one row (along the first axis) as ``.npy``   ``np.load(io.BytesIO(record))``
``.npz``      one row of every array, as ``.npz``          ``dict(np.load(io.BytesIO(record)))``
============  ===========================================  ==================================

Example:
    >>> convert(["rows.parquet"], "out/rows", num_shards=2)  # doctest: +SKIP
    ['out/rows-00000-of-00002.array_record', 'out/rows-00001-of-00002.array_record']
"""

from __future__ import annotations

import base64
import io
import json
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from dataloader.cli.progress import Progress
from dataloader.options import check_int
from dataloader.sources import expand_paths, write_array_record

FORMATS = ("jsonl", "parquet", "npy", "npz")
_EXTENSIONS = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet", ".npy": "npy", ".npz": "npz"}


def _json_default(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    raise TypeError(f"cannot store a {type(value).__name__} in JSON")


def _jsonl(path: str) -> tuple[int, Iterator[bytes]]:
    with open(path, "rb") as f:
        count = sum(1 for line in f if line.strip())

    def records() -> Iterator[bytes]:
        with open(path, "rb") as f:
            for number, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    json.loads(line)
                except ValueError as error:
                    raise ValueError(f"{path}:{number} is not valid JSON: {error}") from None
                yield line

    return count, records()


def _parquet(path: str) -> tuple[int, Iterator[bytes]]:
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(path)

    def records() -> Iterator[bytes]:
        for group in range(parquet.num_row_groups):
            for row in parquet.read_row_group(group).to_pylist():
                yield json.dumps(row, default=_json_default).encode()

    return parquet.metadata.num_rows, records()


def _npy_bytes(array: Any) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.asarray(array), allow_pickle=False)
    return buffer.getvalue()


def _npy(path: str) -> tuple[int, Iterator[bytes]]:
    array = np.load(path, mmap_mode="r", allow_pickle=False)
    if array.ndim == 0:
        raise ValueError(f"{path} holds a single scalar; convert needs an array with rows (first axis)")
    return len(array), (_npy_bytes(row) for row in array)


def _npz(path: str) -> tuple[int, Iterator[bytes]]:
    arrays = dict(np.load(path, allow_pickle=False))
    lengths = {name: (len(a) if a.ndim else None) for name, a in arrays.items()}
    if not arrays or len(set(lengths.values())) != 1 or None in lengths.values():
        raise ValueError(f"{path}: every array needs the same number of rows, got {lengths}")
    count = len(next(iter(arrays.values())))

    def records() -> Iterator[bytes]:
        for i in range(count):
            buffer = io.BytesIO()
            np.savez(buffer, **{name: a[i] for name, a in arrays.items()})
            yield buffer.getvalue()

    return count, records()


_READERS: dict[str, Callable[[str], tuple[int, Iterator[bytes]]]] = {
    "jsonl": _jsonl, "parquet": _parquet, "npy": _npy, "npz": _npz,
}


def input_format(path: str, fmt: str | None = None) -> str:
    """The format named by ``fmt``, or by the file's extension."""
    if fmt is not None:
        if fmt not in FORMATS:
            raise ValueError(f"format {fmt!r} is not one of {', '.join(FORMATS)}")
        return fmt
    ext = os.path.splitext(path)[1].lower()
    if ext not in _EXTENSIONS:
        raise ValueError(
            f"cannot tell the format of {path!r} from its extension; name it with "
            f"--format ({', '.join(FORMATS)})"
        )
    return _EXTENSIONS[ext]


def convert(
    inputs: Sequence[str],
    output_prefix: str,
    *,
    num_shards: int = 1,
    group_size: int = 1,
    fmt: str | None = None,
    progress: bool = True,
) -> list[str]:
    """Writes the records of ``inputs`` as ArrayRecord shards; returns their paths.

    Raises:
        FileNotFoundError: an input does not exist or a glob matches nothing.
        ValueError: no inputs, an input is a directory, an unknown format, a bad
            record, or ``num_shards`` < 1.
    """
    check_int("num_shards", num_shards, 1)
    files = expand_paths(list(inputs), what="input", example_glob="*.parquet")
    opened = [_READERS[input_format(path, fmt)](path) for path in files]
    total = sum(count for count, _ in opened)
    if total < num_shards:
        raise ValueError(f"{total} records cannot fill {num_shards} shards; use num_shards <= {total}")
    stream = (record for _, records in opened for record in records)
    directory = os.path.dirname(os.path.abspath(output_prefix))
    os.makedirs(directory, exist_ok=True)
    bounds = np.linspace(0, total, num_shards + 1).astype(int)
    paths = []
    bar = Progress(f"writing {num_shards} shard(s)", total=total) if progress else None
    try:
        for shard in range(num_shards):
            path = f"{output_prefix}-{shard:05d}-of-{num_shards:05d}.array_record"
            size = int(bounds[shard + 1] - bounds[shard])
            write_array_record(path, _take(stream, size, bar), group_size=group_size)
            paths.append(path)
    finally:
        if bar is not None:
            bar.close()
    return paths


def _take(stream: Iterator[bytes], count: int, bar: Progress | None) -> Iterator[bytes]:
    for _ in range(count):
        yield next(stream)
        if bar is not None:
            bar.update()
