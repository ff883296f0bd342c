"""Times the ways of reading random records through ``array_record``.

Not a test (pytest does not collect it): the measurement behind the choice of
read call in ``sources/array_record.py``. Run from the repository root:

    python tests/sources/bench_array_record_reads.py [--records 200000] [--reads 10240]

It writes a file of ``--records`` records of ~1 KB (half random bytes, half
text) with group_size 1, then reads the same ``--reads`` records in one random
order with each call form and prints microseconds per record (best of 3).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable

import numpy as np
from array_record.python.array_record_module import ArrayRecordReader

from dataloader.sources import ArrayRecordDataSource, write_array_record

BATCH = 128


def _records(count: int):
    rng = np.random.default_rng(0)
    for i in range(count):
        yield rng.bytes(512) + (b"%08d" % i) * 64


def _time(read_all: Callable[[list[int]], object], indices: list[int]) -> float:
    read_all(indices[:256])  # warm up
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        read_all(indices)
        best = min(best, time.perf_counter() - start)
    return best / len(indices) * 1e6


def _batches(indices: list[int]) -> list[list[int]]:
    return [indices[k : k + BATCH] for k in range(0, len(indices), BATCH)]


def _raw_forms(reader: ArrayRecordReader) -> dict[str, Callable[[list[int]], object]]:
    read = reader.read

    def list_one(ids: list[int]) -> None:
        for i in ids:
            read([i])

    def range_one(ids: list[int]) -> None:
        for i in ids:
            read(i, i + 1)

    def list_batch(ids: list[int]) -> None:
        for batch in _batches(ids):
            read(batch)

    def range_loop_batch(ids: list[int]) -> None:
        for batch in _batches(ids):
            [read(i, i + 1)[0] for i in batch]

    def seek_read(ids: list[int]) -> None:
        for i in ids:
            reader.seek(i)
            reader.read()

    return {
        "(a) read([i]) one at a time": list_one,
        "(b) read(i, i+1) one at a time": range_one,
        f"(c) read(list of {BATCH}) per batch": list_batch,
        "(d) [read(i, i+1)[0] for i in batch]": range_loop_batch,
        "(e) seek(i); read()": seek_read,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--reads", type=int, default=10_240)
    parser.add_argument("--skip-slow", action="store_true", help="skip (a) and (e)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "bench.array_record")
        write_array_record(path, _records(args.records))
        rng = np.random.default_rng(1)
        indices = rng.permutation(args.records)[: args.reads].tolist()
        print(
            f"{args.records} records, {os.path.getsize(path) / 1e6:.0f} MB, "
            f"{len(indices)} random reads; us/record, best of 3"
        )
        for options in [
            "",
            "readahead_buffer_size:0",
            "readahead_buffer_size:0,max_parallelism:0",
            "readahead_buffer_size:0,max_parallelism:1",
        ]:
            reader = ArrayRecordReader(path, options)
            for name, form in _raw_forms(reader).items():
                if args.skip_slow and name[:3] in ("(a)", "(e)"):
                    continue
                print(
                    f"{name:40s} {options or '(default options)':44s} {_time(form, indices):8.2f}"
                )
            reader.close()
        source = ArrayRecordDataSource(path)
        array_batches = [np.asarray(b, dtype=np.int64) for b in _batches(indices)]

        def getitem(ids: list[int]) -> None:
            for i in ids:
                source[i]

        def getitems(ids: list[int]) -> None:
            for batch in array_batches if len(ids) == len(indices) else _batches(ids):
                source.__getitems__(batch)

        print(f"{'ArrayRecordDataSource[i]':40s} {'(source)':44s} {_time(getitem, indices):8.2f}")
        print(
            f"{'ArrayRecordDataSource.__getitems__(int64)':40s} {'(source)':44s} "
            f"{_time(getitems, indices):8.2f}"
        )


if __name__ == "__main__":
    main()
