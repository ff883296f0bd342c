"""Paths on any Beam file system: inputs, output names, and what a prefix already holds.

Local paths go through the standard library (and :func:`dataloader.sources.expand_paths`,
so globs and messages are those of the sources); paths with a scheme (``gs://``,
``s3://``, ``hdfs://``) go through Beam's ``FileSystems``, which needs the matching
Beam extra (``apache-beam[gcp]`` for ``gs://``) on the machine that runs the pipeline.
"""

from __future__ import annotations

import os
from typing import IO

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from dataloader.beam.plan import SUFFIX, local_outputs
from dataloader.beam.record_files import RECORD_FORMATS, RecordFormat, for_file, input_format
from dataloader.beam.tfrecord import TFRECORD
from dataloader.sources import expand_paths


def is_local(path: str) -> bool:
    """True for a path of this machine's file system (no ``scheme://``)."""
    return "://" not in path


def open_input(path: str) -> IO[bytes]:
    """Opens ``path`` for reading bytes, on any Beam file system (no decompression)."""
    if is_local(path):
        return open(path, "rb")
    return FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)


def record_format(path: str, fmt: str | None) -> RecordFormat:
    """How to read ``path``: by ``fmt``, or by its extension; through gzip for ``.gz``."""
    name = input_format(path, fmt)
    return for_file(TFRECORD if name == "tfrecord" else RECORD_FORMATS[name], path)


def expand_inputs(inputs: list[str]) -> list[str]:
    """Paths and globs to files, globs sorted, the order of ``inputs`` kept."""
    if not inputs:
        raise ValueError("no inputs; pass files or globs such as 'data/train-*.tfrecord'")
    files: list[str] = []
    for item in inputs:
        if is_local(item):
            files += expand_paths(item, what="input", example_glob="*.tfrecord")
            continue
        matched = sorted(m.path for m in FileSystems.match([item])[0].metadata_list)
        if not matched:
            raise FileNotFoundError(f"input {item!r} matches no file")
        files += matched
    return files


def check_prefix(prefix: str) -> str:
    """``prefix`` if it names files (``out/train``), not a folder (``out/``)."""
    if not prefix or prefix.endswith(("/", os.sep)) or (is_local(prefix) and os.path.isdir(prefix)):
        raise ValueError(
            f"output {prefix!r} must be a prefix of file names such as 'out/train' "
            f"(giving out/train-00000-of-00004{SUFFIX}), not a folder"
        )
    return prefix


def existing_outputs(prefix: str) -> list[str]:
    """The files a run with this prefix would replace: ``PREFIX-*.array_record``."""
    if is_local(prefix):
        return local_outputs(prefix)
    return sorted(m.path for m in FileSystems.match([f"{prefix}-*{SUFFIX}"])[0].metadata_list)
