"""How long granary's parsers take on ordinary and hostile records (issue 21, point 4).

Prints the best of several runs, in milliseconds, for ``parse_example`` (protobuf's
codec), ``describe_record`` (``inspect``) and a TFRecord read whose length field is
forged. Every case is one record, so each row is a per-record cost; the hostile rows
show the bound (a refusal in microseconds, not seconds or gigabytes).

    python benchmarks/parsers.py

The hand-written decoder these replaced, timed on the same machine, took 138 ms for
the 400 KB int64 record, 0.14 ms for the 512-token one and 8.4 s for the 400 KB varint
(quadratic in its length); see the commit history of ``dataloader/maxtext/records.py``.
"""

from __future__ import annotations

import contextlib
import io
import os
import struct
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dataloader.cli.decode import describe_record
from dataloader.maxtext.records import encode_example, parse_example
from dataloader.sources.tfrecord import TFRecordReader, masked_crc


def best_ms(run: Callable[[], object], repeat: int = 7) -> float:
    """The fastest of ``repeat`` calls, in ms; exceptions are part of the work timed."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        with contextlib.suppress(ValueError):
            run()
        times.append(time.perf_counter() - start)
    return 1e3 * min(times)


def example_rows() -> list[tuple[str, bytes]]:
    ids = np.arange(0, 2**62, 2**62 // 50_000, dtype=np.int64)[:50_000]  # 9-byte varints
    return [
        ("Example: 1 KB text", encode_example({"text": [b"y" * 1000]})),
        ("Example: 512 token ids", encode_example({"ids": np.arange(512) * 1000})),
        ("Example: 400 KB of int64", encode_example({"ids": ids})),
        ("Example: 400 KB varint (hostile)", b"\x08" + b"\xff" * 400_000),
    ]


def inspect_rows() -> list[tuple[str, bytes]]:
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f8", "fortran_order": False, "shape": (10**6, 10**5)})
    npz = io.BytesIO()
    np.savez_compressed(npz, zeros=np.zeros(1 << 24))  # 128 MiB of zeros in ~130 KB
    return [
        ("inspect: .npy claiming 745 GiB", header.getvalue() + b"x" * 65),
        ("inspect: .npz of 128 MiB zeros", npz.getvalue()),
        ("inspect: JSON nested 100,000 deep", b"[" * 100_000 + b"]" * 100_000),
        ("inspect: truncated Example", encode_example({"text": [b"hello world"]})[:14]),
    ]


def forged_tfrecord_ms() -> float:
    raw = struct.pack("<Q", 1 << 40)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "forged.tfrecord")
        with open(path, "wb") as f:
            f.write(raw + struct.pack("<I", masked_crc(raw)) + b"x" * 32)

        def read() -> None:
            with TFRecordReader(path) as reader:
                reader.read()

        return best_ms(read)


def main() -> None:
    for name, record in example_rows():
        print(f"{name:38s} {len(record):>9,} B  {best_ms(lambda r=record: parse_example(r)):9.3f} ms")
    for name, record in inspect_rows():
        print(f"{name:38s} {len(record):>9,} B  {best_ms(lambda r=record: describe_record(r)):9.3f} ms")
    print(f"{'TFRecord: 44-byte file claiming 1 TiB':38s} {44:>9,} B  {forged_tfrecord_ms():9.3f} ms")


if __name__ == "__main__":
    main()
