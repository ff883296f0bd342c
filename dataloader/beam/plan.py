"""Which input records go to which output shard: pure functions of the record counts.

A shard is a list of slices ``(file index, start, stop)`` read in order, so each shard
is written by one worker streaming its slices straight from the input files into the
ArrayRecord writer: no record goes through a shuffle, memory stays flat whatever the
shard's size, and the order within a shard is the input order by construction.

* ``num_shards=N`` cuts the concatenated inputs (files in the order given) into ``N``
  contiguous runs whose sizes differ by at most one, exactly as the single-process
  converter does, so both write the same bytes.
* ``match_shards`` writes each input file to a shard of its own, named after it.

The shards' names, and the refusal to write over an existing output, are here too: this
module imports no Beam, so the single-process converter (``dataloader.cli.convert``)
plans, names and refuses exactly as the pipeline does.
"""

from __future__ import annotations

import glob
from collections.abc import Sequence
from dataclasses import dataclass

from dataloader.beam.record_files import split_name

SUFFIX = ".array_record"


def shard_path(prefix: str, index: int, count: int) -> str:
    """``PREFIX-0000i-of-0000N.array_record``, the names Beam's file sinks use."""
    return f"{prefix}-{index:05d}-of-{count:05d}{SUFFIX}"


def matched_path(prefix: str, input_path: str) -> str:
    """``PREFIX-<input name without its format>.array_record`` (``--match_shards``).

    The format's extension and ``.gz`` go, shard numbers stay at the end:
    ``mnist-train.tfrecord-00003-of-00016.gz`` gives
    ``PREFIX-mnist-train-00003-of-00016.array_record``.
    """
    name = split_name(input_path)
    return f"{prefix}-{name.stem}{name.shard}{SUFFIX}"


def local_outputs(prefix: str) -> list[str]:
    """The local files a run with this prefix would replace: ``PREFIX-*.array_record``."""
    return sorted(glob.glob(glob.escape(prefix) + f"-*{SUFFIX}"))


def refusal(existing: list[str]) -> str:
    """The message that refuses to write over existing output."""
    shown = ", ".join(existing[:3]) + (f" and {len(existing) - 3} more" if len(existing) > 3 else "")
    return (
        f"the output already exists ({shown}); pass --overwrite (overwrite=True) to replace "
        "all of it, or choose another --output prefix"
    )


@dataclass(frozen=True)
class ShardPlan:
    """One output shard: its index, final path and input slices.

    Attributes:
        index: the shard's number, from 0.
        path: where the shard ends up.
        slices: ``(file index, start, stop)`` runs of input records, in order;
            ``stop`` is ``None`` for "to the end of the file".
    """

    index: int
    path: str
    slices: tuple[tuple[int, int, int | None], ...]


def contiguous_plans(prefix: str, counts: Sequence[int], num_shards: int) -> list[ShardPlan]:
    """``num_shards`` contiguous shards over files of ``counts`` records each.

    Shard ``s`` holds global records ``[s * T // N, (s + 1) * T // N)`` for ``T`` records
    in all (the bounds of ``np.linspace(0, T, N + 1)`` rounded down).

    Raises:
        ValueError: fewer records than shards (a shard would be empty, and an empty
            ArrayRecord file cannot be read back).
    """
    total = sum(counts)
    if total < num_shards:
        raise ValueError(
            f"{total} records cannot fill {num_shards} shards; use num_shards <= {total}"
        )
    starts = [0]
    for count in counts:
        starts.append(starts[-1] + count)
    plans = []
    for shard in range(num_shards):
        lo, hi = shard * total // num_shards, (shard + 1) * total // num_shards
        slices = []
        for file_index in range(len(counts)):
            first, end = starts[file_index], starts[file_index + 1]
            a, b = max(lo, first), min(hi, end)
            if a < b:
                slices.append((file_index, a - first, b - first))
        plans.append(ShardPlan(shard, shard_path(prefix, shard, num_shards), tuple(slices)))
    return plans


def matched_plans(prefix: str, files: Sequence[str]) -> list[ShardPlan]:
    """One shard per input file, ``PREFIX-<file name>.array_record``.

    Raises:
        ValueError: two inputs would give the same shard name.
    """
    plans: list[ShardPlan] = []
    seen: dict[str, str] = {}
    for index, path in enumerate(files):
        target = matched_path(prefix, path)
        if target in seen:
            raise ValueError(
                f"--match_shards would write both {seen[target]!r} and {path!r} to {target!r}; "
                "give the inputs distinct file names, or use --num_shards"
            )
        seen[target] = path
        plans.append(ShardPlan(index, target, ((index, 0, None),)))
    return plans
