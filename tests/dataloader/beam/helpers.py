"""Inputs for the Beam tests: TFRecord files written by Beam itself, read back independently."""

from __future__ import annotations

import os
import pathlib
import struct

import apache_beam as beam
from apache_beam.io.tfrecordio import WriteToTFRecord


def parse_tfrecord(path: str) -> list[bytes]:
    """The records of a TFRecord file by its framing alone (no CRC check): the test's
    own reader, independent of the code under test."""
    records, data = [], pathlib.Path(path).read_bytes()
    offset = 0
    while offset < len(data):
        (length,) = struct.unpack("<Q", data[offset:offset + 8])
        records.append(data[offset + 12:offset + 12 + length])
        offset += 16 + length
    return records


def beam_tfrecords(folder: str, num_records: int = 300, num_files: int = 3) -> list[str]:
    """Writes records of varied length with Beam's WriteToTFRecord; returns the files."""
    prefix = os.path.join(folder, "tf", "part")
    records = [b"record-%05d-" % i + b"x" * (i % 37) for i in range(num_records)]
    with beam.Pipeline() as p:
        _ = p | beam.Create(records) | WriteToTFRecord(prefix, num_shards=num_files, file_name_suffix=".tfrecord")
    files = sorted(os.path.join(folder, "tf", name) for name in os.listdir(os.path.join(folder, "tf")))
    assert len(files) == num_files and sorted(r for f in files for r in parse_tfrecord(f)) == sorted(records)
    return files


def corrupt(path: str, offset: int, out: str) -> str:
    """A copy of ``path`` with one bit flipped at ``offset``."""
    data = bytearray(pathlib.Path(path).read_bytes())
    data[offset] ^= 0x01
    with open(out, "wb") as f:
        f.write(bytes(data))
    return out
