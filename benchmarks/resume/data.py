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
FORMATS = ("array_record", "parquet", "litdata", "litdata_tokens", "litdata_filter", "litdata_flat_map",
           "mds", "mds_packed", "mds_filter", "mds_flat_map")


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
    if fmt.startswith("litdata"):
        import litdata

        # One worker writes the chunks in input order; several chunks, as a real data set has.
        tokens = fmt == "litdata_tokens"
        litdata.optimize(
            fn=_LITDATA_FNS[fmt], inputs=list(order), output_dir=directory, num_workers=1,
            chunk_size=None if tokens else max(1, -(-len(order) // SHARDS)),
            chunk_bytes=f"{max(1, len(order) * 7 * 4 // SHARDS // 1000)}KB" if tokens else None,
            item_loader=_tokens_loader() if tokens else None,
            mode=None, verbose=False,
        )
        return directory
    if fmt.startswith("mds"):
        _write_mds(fmt, directory, order)
        return directory
    raise ValueError(f"unknown format {fmt!r}; expected one of {FORMATS}")


def _write_mds(fmt: str, directory: str, order: Sequence[int]) -> None:
    """MosaicML's MDS shards, written with ``streaming.MDSWriter`` (in benchmarks/.venv-mosaic).
    As for LitData, what MosaicML does at conversion time happens here: the filter and the
    flat map decide which samples are written, and packing writes rows of ``common.ROW``
    tokens (packed in the given order, as a conversion script packs a corpus)."""
    from resume.mosaic_cols import streaming
    from resume.torch_cols import pack_rows

    examples = [{"id": i, "tokens": common.record(i)} for i in order]
    if fmt == "mds_filter":
        samples = [{"id": e["id"]} for e in examples if common.keep(e)]
    elif fmt == "mds_flat_map":
        samples = [{"id": out["id"]} for e in examples for out in common.fan_out(e)]
    elif fmt == "mds_packed":
        samples = [{"tokens": row["tokens"]} for row in pack_rows(examples)]
    else:
        samples = [{"tokens": e["tokens"]} for e in examples]
    columns = {"tokens": "ndarray:int32"} if "tokens" in samples[0] else {"id": "int64"}
    # Shards of about a quarter of the samples each, as the other formats have.
    size = sum(len(s.get("tokens", ())) * 4 + 16 for s in samples)
    with streaming().MDSWriter(out=directory, columns=columns, size_limit=max(1 << 10, size // SHARDS)) as writer:
        for sample in samples:
            writer.write(sample)


def _litdata_item(i: int) -> dict:
    return {"tokens": common.record(i)}


def _litdata_tokens(i: int):
    import torch

    return torch.from_numpy(common.record(i))


def _litdata_filter(i: int):
    """The filter where LitData puts it: in the function that writes the data set."""
    if common.keep({"id": i}):
        yield {"id": i}


def _litdata_flat_map(i: int):
    yield from ({"id": e["id"]} for e in common.fan_out({"id": i, "tokens": None}))


_LITDATA_FNS = {"litdata": _litdata_item, "litdata_tokens": _litdata_tokens,
                "litdata_filter": _litdata_filter, "litdata_flat_map": _litdata_flat_map}


def _tokens_loader():
    from litdata.streaming.item_loader import TokensLoader

    return TokensLoader()
