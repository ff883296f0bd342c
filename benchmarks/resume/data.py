"""Writes the records of :mod:`.common` in each loader's own format.

Every format holds the records in four files (shards) of consecutive records, in the
order given (``range(n)``, or :func:`common.order_for_change` for the regenerated files
of the source_changed scenario), so the same ids sit at the same places in every format.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence

from resume import common

SHARDS = 4
FORMATS = ("array_record", "parquet", "litdata", "litdata_tokens")


def _split(order: Sequence[int]) -> list[Sequence[int]]:
    step = -(-len(order) // SHARDS)
    return [order[k:k + step] for k in range(0, len(order), step)]


def write(fmt: str, directory: str, order: Sequence[int]) -> str:
    """Writes the records ``order`` into ``directory`` (emptied first) in ``fmt``;
    returns what the loader is given: a glob, or the directory."""
    if os.path.isdir(directory):
        shutil.rmtree(directory)
    os.makedirs(directory)
    if fmt == "array_record":
        import dataloader as dl

        for k, part in enumerate(_split(order)):
            dl.write_array_record(
                os.path.join(directory, f"part-{k:05d}.array_record"),
                [common.record(i).tobytes() for i in part],
            )
        return os.path.join(directory, "part-*.array_record")
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        for k, part in enumerate(_split(order)):
            table = pa.table({"tokens": pa.array([common.record(i) for i in part], pa.list_(pa.int32()))})
            pq.write_table(table, os.path.join(directory, f"part-{k:05d}.parquet"))
        return os.path.join(directory, "part-*.parquet")
    if fmt in ("litdata", "litdata_tokens"):
        import litdata

        # One optimize call per shard file order: litdata writes chunks in input order
        # with one worker; chunk_size keeps several chunks, as a real data set has.
        fn = _litdata_tokens if fmt == "litdata_tokens" else _litdata_item
        litdata.optimize(
            fn=fn, inputs=list(order), output_dir=directory, num_workers=1,
            chunk_size=max(1, -(-len(order) // SHARDS)) if fmt == "litdata" else None,
            chunk_bytes=None if fmt == "litdata" else "4KB",
            item_loader=_tokens_loader() if fmt == "litdata_tokens" else None,
            mode=None, verbose=False,
        )
        return directory
    raise ValueError(f"unknown format {fmt!r}; expected one of {FORMATS}")


def _litdata_item(i: int) -> dict:
    return {"tokens": common.record(i)}


def _litdata_tokens(i: int):
    import torch

    return torch.from_numpy(common.record(i))


def _tokens_loader():
    from litdata.streaming.item_loader import TokensLoader

    return TokensLoader()
