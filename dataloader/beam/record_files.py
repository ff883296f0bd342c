"""Reading record files in order, each record encoded as bytes: conversion's contract.

``convert`` (in one process or on Apache Beam) turns every record of its inputs into
one ArrayRecord record. This module says how, format by format, and reads any range of
a file's records in file order, so a converter can cut the inputs into shards without
holding them:

============  ===========================================  ==================================
input         one record is                                decode with
============  ===========================================  ==================================
``.jsonl``    the line's UTF-8 text, stripped (checked to  ``json.loads(record)``
              be JSON; blank lines are skipped)
``.csv``      a row as a JSON object from the header's     ``json.loads(record)``
              column names to the cells' text (no type
              guessing: ``1`` stays ``"1"``)
``.parquet``  the row as a JSON object (lists for list     ``json.loads(record)``
              columns, base64 text for binary columns)
``.npy``      one row (along the first axis) as ``.npy``   ``np.load(io.BytesIO(record))``
``.npz``      one row of every array, as ``.npz``          ``dict(np.load(io.BytesIO(record)))``
``.tfrecord`` the record's bytes as they are               (``tf.train.Example`` etc.)
============  ===========================================  ==================================

TFRecord is read by granary's one TFRecord frame codec
(``dataloader.sources.tfrecord.frames``, needing ``google-crc32c``), so its reader lives in
``dataloader.beam.tfrecord``; every other format is here (numpy, pyarrow, the
standard library). CSV files are UTF-8, with a header row and the ``excel`` dialect of
Python's ``csv`` module (quoted cells may hold commas and newlines).

File names. The format is told from the extension, wherever the shard numbers are
(Beam's ``x-00000-of-00004.tfrecord``, TensorFlow's and TFDS's
``mnist-train.tfrecord-00000-of-00016``), and a ``.gz`` at the end (or before the
shard numbers) means gzip: TFRecord, JSON lines and CSV files are then read through
the standard library's ``gzip``, streaming, as TensorFlow's and Beam's readers do
(:func:`for_file`). Parquet and numpy files are read in slices, so a gzipped one is
refused: decompress it first.

Each reader takes ``open_file``, a function from a path to a binary file object, so
the same code reads local files (the default, ``open(path, "rb")``) and, on Beam,
files of any Beam file system (``gs://``, ``s3://``, ``hdfs://``). Errors are
``ValueError``s that start with the path and say where in the file (line, row group,
byte offset).

Example:
    >>> fmt = RECORD_FORMATS[input_format("rows.jsonl")]  # doctest: +SKIP
    >>> fmt.count("rows.jsonl"), list(fmt.read("rows.jsonl", start=1, stop=3))  # doctest: +SKIP
    (5, [b'{"i": 1}', b'{"i": 2}'])
"""

from __future__ import annotations

import base64
import csv
import functools
import gzip
import io
import itertools
import json
import os
import posixpath
import re
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any

import numpy as np

Opener = Callable[[str], IO[bytes]]

EXTENSIONS = {
    ".jsonl": "jsonl", ".json": "jsonl", ".csv": "csv", ".parquet": "parquet",
    ".npy": "npy", ".npz": "npz", ".tfrecord": "tfrecord", ".tfrecords": "tfrecord",
}
FORMATS = ("jsonl", "csv", "parquet", "npy", "npz", "tfrecord")
# The formats read as one stream from the start, which a gzip stream can be.
STREAMED = ("jsonl", "csv", "tfrecord")
_SHARD_NUMBERS = re.compile(r"-\d+-of-\d+$")


@dataclass(frozen=True)
class FileName:
    """A file name cut into ``stem + extension + shard + compression``.

    Attributes:
        stem: the name without the parts below (``mnist-train``).
        extension: a known format's extension, lower case (``.tfrecord``), or ``""``:
            an unknown extension stays in ``stem``.
        shard: shard numbers after the extension (``-00000-of-00016``), else ``""``.
        gzip: the name ends in ``.gz`` (before or after the shard numbers).
    """

    stem: str
    extension: str
    shard: str
    gzip: bool


def split_name(path: str) -> FileName:
    """Cuts the file name of ``path`` (local or ``scheme://``) into its parts.

    Example:
        >>> split_name("gs://b/mnist-train.tfrecord-00003-of-00016.gz")
        FileName(stem='mnist-train', extension='.tfrecord', shard='-00003-of-00016', gzip=True)
    """
    name = posixpath.basename(path.replace(os.sep, "/").rstrip("/"))
    shard, compressed = "", False
    for _ in range(2):  # the shard numbers and .gz, in either order
        match = _SHARD_NUMBERS.search(name)
        if match and not shard:
            shard, name = match.group(), name[: match.start()]
        if name.lower().endswith(".gz") and not compressed:
            compressed, name = True, name[:-3]
    stem, extension = os.path.splitext(name)
    if extension.lower() not in EXTENSIONS:
        stem, extension = name, ""
    return FileName(stem, extension.lower(), shard, compressed)


def open_local(path: str) -> IO[bytes]:
    """The default opener: a local file, read as bytes."""
    return open(path, "rb")


def input_format(path: str, fmt: str | None = None) -> str:
    """The format named by ``fmt``, or by the file's extension.

    ``data-0001.tfrecord``, ``data.tfrecord-00001-of-00010`` and ``data.tfrecord.gz``
    are all TFRecord (see the module docstring).

    Raises:
        ValueError: an unknown ``fmt`` or extension, or a gzipped file of a format
            that is not read as a stream.
    """
    if fmt is not None:
        if fmt not in FORMATS:
            raise ValueError(f"format {fmt!r} is not one of {', '.join(FORMATS)}")
    else:
        parts = split_name(path)
        if not parts.extension:
            if re.search(r"\.array_?record(-\d+-of-\d+)?$", path, re.IGNORECASE):
                raise ValueError(
                    f"{path!r} is already ArrayRecord; read it with ArrayRecordDataSource "
                    "(convert writes ArrayRecord from other formats)"
                )
            raise ValueError(
                f"cannot tell the format of {path!r} from its extension; name it with "
                f"--format ({', '.join(FORMATS)})"
            )
        fmt = EXTENSIONS[parts.extension]
    if split_name(path).gzip and fmt not in STREAMED:
        raise ValueError(
            f"{path!r} is gzip-compressed {fmt}, which is read in slices, not as one "
            f"stream; decompress it first (gunzip), or compress only {', '.join(STREAMED)} files"
        )
    return fmt


class _GzipInput(gzip.GzipFile):
    """A gzip stream over a file it closes with itself (GzipFile leaves it open)."""

    def __init__(self, raw: IO[bytes]) -> None:
        super().__init__(fileobj=raw, mode="rb")
        self._raw = raw

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._raw.close()


def _open_gzip(open_file: Opener, path: str) -> IO[bytes]:
    raw = open_file(path)
    try:
        return _GzipInput(raw)  # type: ignore[return-value]  # GzipFile is a binary file, not typed as IO
    except BaseException:
        raw.close()
        raise


_GZIP_ERRORS = (gzip.BadGzipFile, EOFError, zlib.error)


def _gzip_error(path: str, error: Exception) -> ValueError:
    return ValueError(f"{path}: its gzip data is damaged or truncated ({error}); rewrite or drop the file")


def _count_gzip(count: Callable[..., int], path: str, open_file: Opener = open_local) -> int:
    try:
        return count(path, functools.partial(_open_gzip, open_file))
    except _GZIP_ERRORS as error:
        raise _gzip_error(path, error) from None


def _read_gzip(read: Callable[..., Iterator[bytes]], path: str, open_file: Opener = open_local,
               start: int = 0, stop: int | None = None) -> Iterator[bytes]:
    try:
        yield from read(path, functools.partial(_open_gzip, open_file), start, stop)
    except _GZIP_ERRORS as error:
        raise _gzip_error(path, error) from None


def for_file(fmt: RecordFormat, path: str) -> RecordFormat:
    """``fmt`` as it reads ``path``: through gzip when the name says it is compressed.

    Example:
        >>> for_file(RECORD_FORMATS["jsonl"], "rows.jsonl.gz").count("rows.jsonl.gz")  # doctest: +SKIP
        5
    """
    if not split_name(path).gzip:
        return fmt
    return RecordFormat(fmt.name, functools.partial(_count_gzip, fmt.count),
                        functools.partial(_read_gzip, fmt.read))


@dataclass(frozen=True)
class RecordFormat:
    """How to count and read one format's records.

    Attributes:
        name: the format's name (``"jsonl"``).
        count: ``count(path, open_file=open_local) -> int``, the number of records.
        read: ``read(path, open_file=open_local, start=0, stop=None)``, an iterator of
            the encoded records ``start`` to ``stop`` (exclusive; ``None``: to the end),
            in file order.
    """

    name: str
    count: Callable[..., int]
    read: Callable[..., Iterator[bytes]]


def _json_default(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    raise TypeError(f"cannot store a {type(value).__name__} in JSON")


# JSON lines ------------------------------------------------------------------------


def _json_lines(path: str, open_file: Opener) -> Iterator[tuple[int, bytes]]:
    """(line number, stripped line) of every non-blank line."""
    with open_file(path) as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if line:
                yield number, line


def _count_jsonl(path: str, open_file: Opener = open_local) -> int:
    return sum(1 for _ in _json_lines(path, open_file))


def _read_jsonl(path: str, open_file: Opener = open_local, start: int = 0,
                stop: int | None = None) -> Iterator[bytes]:
    for number, line in itertools.islice(_json_lines(path, open_file), start, stop):
        try:
            json.loads(line)
        except ValueError as error:
            raise ValueError(f"{path}:{number} is not valid JSON: {error}") from None
        yield line


# CSV -------------------------------------------------------------------------------


def _csv_rows(path: str, open_file: Opener) -> Iterator[tuple[list[str], list[str]]]:
    """Each data row, checked, with the header: ``(header, cells)``."""
    with open_file(path) as raw, io.TextIOWrapper(raw, encoding="utf-8", newline="") as text:
        reader = csv.reader(text)
        try:
            header = next(reader, None)
            if header is None:
                return
            if len(set(header)) != len(header):
                raise ValueError(f"{path}:1: the header names a column twice: {header}")
            for row in reader:
                if not row:
                    continue  # a blank line
                if len(row) != len(header):
                    raise ValueError(
                        f"{path}:{reader.line_num}: {len(row)} cells, but the header has "
                        f"{len(header)} columns ({', '.join(header)})"
                    )
                yield header, row
        except (csv.Error, UnicodeDecodeError) as error:
            raise ValueError(f"{path}:{reader.line_num}: not readable as UTF-8 CSV: {error}") from None


def _count_csv(path: str, open_file: Opener = open_local) -> int:
    return sum(1 for _ in _csv_rows(path, open_file))


def _read_csv(path: str, open_file: Opener = open_local, start: int = 0,
              stop: int | None = None) -> Iterator[bytes]:
    """Each data row as a JSON object keyed by the header's column names."""
    rows = itertools.islice(_csv_rows(path, open_file), start, stop)
    return (json.dumps(dict(zip(header, row, strict=True))).encode() for header, row in rows)


# Parquet ---------------------------------------------------------------------------


def _parquet_file(path: str, open_file: Opener) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    source: Any = path if open_file is open_local else open_file(path)
    try:
        return pq.ParquetFile(source)
    except (pa.ArrowException, OSError) as error:
        raise ValueError(f"{path} is not a readable Parquet file: {error}") from None


def _count_parquet(path: str, open_file: Opener = open_local) -> int:
    return _parquet_file(path, open_file).metadata.num_rows


def _read_parquet(path: str, open_file: Opener = open_local, start: int = 0,
                  stop: int | None = None) -> Iterator[bytes]:
    import pyarrow as pa

    parquet = _parquet_file(path, open_file)
    stop = parquet.metadata.num_rows if stop is None else stop
    first = 0  # the index of the current row group's first row
    for group in range(parquet.num_row_groups):
        rows = parquet.metadata.row_group(group).num_rows
        if first + rows > start and first < stop:  # skip groups outside [start, stop)
            try:
                table = parquet.read_row_group(group)
            except (pa.ArrowException, OSError) as error:
                raise ValueError(
                    f"{path}: row group {group} (rows {first} to {first + rows - 1}) cannot "
                    f"be read: {error}"
                ) from None
            lo, hi = max(start - first, 0), min(stop - first, rows)
            for row in table.slice(lo, hi - lo).to_pylist():
                yield json.dumps(row, default=_json_default).encode()
        first += rows


# NumPy -----------------------------------------------------------------------------


def _load(path: str, open_file: Opener, **kwargs: Any) -> Any:
    # Local .npy files are memory-mapped, so a shard reads only its rows; other file
    # systems have no mmap and load the array whole.
    try:
        if open_file is open_local:
            return np.load(path, allow_pickle=False, **kwargs)
        with open_file(path) as f:
            loaded = np.load(io.BytesIO(f.read()), allow_pickle=False)
            return dict(loaded) if isinstance(loaded, np.lib.npyio.NpzFile) else loaded
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as error:
        raise ValueError(f"{path} is not a readable numpy file: {error}") from None


def _npy_array(path: str, open_file: Opener) -> np.ndarray:
    array = _load(path, open_file, mmap_mode="r")
    if array.ndim == 0:
        raise ValueError(f"{path} holds a single scalar; convert needs an array with rows (first axis)")
    return array


def _npy_bytes(array: Any) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.asarray(array), allow_pickle=False)
    return buffer.getvalue()


def _count_npy(path: str, open_file: Opener = open_local) -> int:
    return len(_npy_array(path, open_file))


def _read_npy(path: str, open_file: Opener = open_local, start: int = 0,
              stop: int | None = None) -> Iterator[bytes]:
    return (_npy_bytes(row) for row in _npy_array(path, open_file)[start:stop])


def _npz_arrays(path: str, open_file: Opener) -> tuple[dict[str, np.ndarray], int]:
    loaded = _load(path, open_file)
    try:
        arrays = dict(loaded)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as error:  # a damaged member of the zip
        raise ValueError(f"{path} is not a readable numpy file: {error}") from None
    finally:
        if isinstance(loaded, np.lib.npyio.NpzFile):
            loaded.close()
    lengths = {name: (len(a) if a.ndim else None) for name, a in arrays.items()}
    if not arrays or len(set(lengths.values())) != 1 or None in lengths.values():
        raise ValueError(f"{path}: every array needs the same number of rows, got {lengths}")
    return arrays, len(next(iter(arrays.values())))


def _count_npz(path: str, open_file: Opener = open_local) -> int:
    return _npz_arrays(path, open_file)[1]


def _read_npz(path: str, open_file: Opener = open_local, start: int = 0,
              stop: int | None = None) -> Iterator[bytes]:
    arrays, count = _npz_arrays(path, open_file)
    for i in range(count)[start:stop]:
        buffer = io.BytesIO()
        np.savez(buffer, **{name: a[i] for name, a in arrays.items()})
        yield buffer.getvalue()


RECORD_FORMATS: dict[str, RecordFormat] = {
    "jsonl": RecordFormat("jsonl", _count_jsonl, _read_jsonl),
    "csv": RecordFormat("csv", _count_csv, _read_csv),
    "parquet": RecordFormat("parquet", _count_parquet, _read_parquet),
    "npy": RecordFormat("npy", _count_npy, _read_npy),
    "npz": RecordFormat("npz", _count_npz, _read_npz),
}
"""Every format but ``tfrecord`` (see ``dataloader.beam.tfrecord``)."""
