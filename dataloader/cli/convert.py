"""Converting record files to ArrayRecord shards in this process (no Apache Beam).

``python -m dataloader convert`` runs the Beam pipeline of :mod:`dataloader.beam`; this
single-process loop is what it falls back to when Beam is not installed, and the
reference the pipeline is tested against: for the same inputs and ``num_shards`` both
write the same bytes. Each input record becomes one ArrayRecord record, encoded as
:mod:`dataloader.beam.record_files` says (its table lists every format), in input
order (files in the order given, globs sorted), cut into ``num_shards`` contiguous
shards ``<prefix>-00000-of-0000N.array_record`` with ``group_size=1`` by default (what
random access wants; see :func:`sources.write_array_record`).

Shards are written under temporary names and renamed only when all are complete, so a
failure leaves no shard behind; an existing output (``<prefix>-*.array_record``) is
refused unless ``overwrite``, and then replaced whole. TFRecord inputs are read with
granary's TFRecord frame codec, which needs the ``tfrecord`` extra (google-crc32c).

Example:
    >>> convert(["rows.parquet"], "out/rows", num_shards=2)  # doctest: +SKIP
    ['out/rows-00000-of-00002.array_record', 'out/rows-00001-of-00002.array_record']
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from typing import Any

from dataloader.beam.plan import contiguous_plans, local_outputs, refusal
from dataloader.beam.record_files import (
    RECORD_FORMATS,
    RecordFormat,
    for_file,
    input_format,
    open_local,
)
from dataloader.engine.stats.progress import Progress
from dataloader.errors import ConvertError
from dataloader.options import check_int
from dataloader.sources import expand_paths, write_array_record


def _record_format(path: str, fmt: str | None) -> RecordFormat:
    name = input_format(path, fmt)
    if name != "tfrecord":
        return for_file(RECORD_FORMATS[name], path)
    from dataloader.beam.tfrecord import TFRECORD  # imports no Beam: only the frame codec

    return for_file(TFRECORD, path)


def _opener(path: str) -> Any:
    """How to open ``path``: the formats' local opener, or fsspec for a URL."""
    if "://" not in path:
        return open_local
    from dataloader.sources.remote.urls import open_path

    return open_path


def convert(
    inputs: Sequence[str],
    output_prefix: str,
    *,
    num_shards: int = 1,
    group_size: int = 1,
    fmt: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> list[str]:
    """Writes the records of ``inputs`` as ArrayRecord shards; returns their paths.

    Raises:
        FileNotFoundError: an input does not exist or a glob matches nothing.
        ConvertError: the output exists and ``overwrite`` is off.
        ValueError: no inputs, an input is a directory, an unknown format, a bad
            record (the message names the file and where), or ``num_shards`` < 1.
    """
    check_int("num_shards", num_shards, 1)
    files = expand_paths(list(inputs), what="input", example_glob="*.parquet")
    formats = [_record_format(path, fmt) for path in files]
    old = local_outputs(output_prefix)
    if old and not overwrite:
        raise ConvertError(refusal(old))
    openers = [_opener(path) for path in files]
    counts = [f.count(path, o) for f, path, o in zip(formats, files, openers, strict=True)]
    plans = contiguous_plans(output_prefix, counts, num_shards)
    os.makedirs(os.path.dirname(os.path.abspath(output_prefix)), exist_ok=True)
    paths = [plan.path for plan in plans]
    temps = [os.path.join(os.path.dirname(os.path.abspath(p)), f".{os.path.basename(p)}.{os.getpid()}.part")
             for p in paths]
    # One pass over the inputs (a file cut between shards is not read again from its start).
    stream = (record for f, path, o in zip(formats, files, openers, strict=True)
              for record in f.read(path, o))
    bar = Progress(f"writing {num_shards} shard(s)", total=sum(counts)) if progress else None
    try:
        for plan, temp in zip(plans, temps, strict=True):
            size = sum(stop - start for _, start, stop in plan.slices if stop is not None)
            write_array_record(temp, _take(stream, size, bar), group_size=group_size)
        for path in old:  # all shards are complete: replace the old output whole
            os.remove(path)
        for temp, path in zip(temps, paths, strict=True):
            os.replace(temp, path)
    finally:
        for temp in temps:
            with contextlib.suppress(FileNotFoundError):
                os.remove(temp)
        if bar is not None:
            bar.close()
    return paths


def _take(stream: Iterator[bytes], count: int, bar: Progress | None) -> Iterator[bytes]:
    for _ in range(count):
        yield next(stream)
        if bar is not None:
            bar.update()
