"""The conversion pipeline: count, plan, write each shard from its slices, commit.

::

    files --Reshuffle--> count records per file --ToList--> plan shards
          --Reshuffle--> write each shard (stream its slices into a staged file)
          --ToList-->    commit (rename every staged shard into place, write a summary)

``--match_shards`` skips the count: each file is a shard. Only file names, counts, plans
and results travel between steps; records go from an input file to an output file
inside one worker, so no record is shuffled and a shard's order is its input order
(see :mod:`dataloader.beam.plan`). A ``Reshuffle`` before each fan-out lets the runner
spread files and shards over its workers.

Errors in the inputs are raised as :class:`~dataloader.errors.ConvertError` naming the
file and the place in it; the driver (:mod:`dataloader.beam.run`) turns a runner's
wrapped failure back into that message and removes the staging folder.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import apache_beam as beam

from dataloader.beam.files import open_input, record_format
from dataloader.beam.plan import ShardPlan, contiguous_plans, matched_plans
from dataloader.beam.sink import ShardResult, Staging, finalize, report, write_shard, write_summary
from dataloader.errors import ConvertError


def _records(files: list[str], fmt: str | None, plan: ShardPlan) -> Iterator[bytes]:
    """The records of a shard's slices, in order; checks each slice's length."""
    for file_index, start, stop in plan.slices:
        path = files[file_index]
        n = start
        try:
            for record in record_format(path, fmt).read(path, open_input, start, stop):
                n += 1
                yield record
        except (ValueError, OSError) as error:
            raise ConvertError(str(error)) from None
        if stop is not None and n != stop:
            raise ConvertError(
                f"{path}: ended at record {n}, but was counted to hold at least {stop} "
                "(did it change during the conversion?)"
            )


class _CountRecords(beam.DoFn):
    def __init__(self, files: list[str], fmt: str | None) -> None:
        self.files, self.fmt = files, fmt

    def process(self, file_index: int) -> Iterator[tuple[int, int]]:
        path = self.files[file_index]
        try:
            yield file_index, record_format(path, self.fmt).count(path, open_input)
        except (ValueError, OSError) as error:
            raise ConvertError(str(error)) from None


def _plan(counts: list[tuple[int, int]], prefix: str, num_shards: int, staging: Staging) -> list[ShardPlan]:
    by_file = dict(counts)
    try:
        plans = contiguous_plans(prefix, [by_file[i] for i in range(len(by_file))], num_shards)
    except ValueError as error:
        raise ConvertError(str(error)) from None
    if staging.total_file() is not None:  # the driver's progress bar learns the total here
        staging.create()
        report(staging.total_file(), sum(by_file.values()))
    return plans


class _WriteShard(beam.DoFn):
    def __init__(self, files: list[str], fmt: str | None, staging: Staging, writer_options: str) -> None:
        self.files, self.fmt, self.staging, self.writer_options = files, fmt, staging, writer_options

    def process(self, plan: ShardPlan) -> Iterator[ShardResult]:
        result = write_shard(self.staging, plan.index, plan.path,
                             _records(self.files, self.fmt, plan), self.writer_options)
        if result.count == 0:
            raise ConvertError(
                f"{self.files[plan.slices[0][0]]} holds no records, and an empty shard cannot be "
                "read by ArrayRecordDataSource; leave it out of the inputs"
            )
        yield result


class _Commit(beam.DoFn):
    def __init__(self, staging: Staging, num_shards: int, overwrite: bool) -> None:
        self.staging, self.num_shards, self.overwrite = staging, num_shards, overwrite

    def process(self, results: list[ShardResult]) -> Iterator[list[ShardResult]]:
        done = finalize(self.staging, results, self.num_shards, self.overwrite)
        write_summary(self.staging, done)
        yield done


class ConvertToArrayRecord(beam.PTransform):
    """Converts record files to ArrayRecord shards; applied to the pipeline itself.

    Args:
        files: the input files, in order (already expanded: see ``files.expand_inputs``).
        staging: where this run stages its shards (its ``prefix`` is the output prefix).
        num_shards: contiguous shards to cut the inputs into; ignored with ``match_shards``.
        match_shards: one shard per input file, named after it.
        fmt: the input format, or ``None`` to tell by each file's extension.
        writer_options: ArrayRecord writer options (``group_size:1``).
        overwrite: replace an existing output (all of ``PREFIX-*.array_record``).

    The output is a one-element PCollection: the list of :class:`ShardResult`.
    """

    def __init__(self, files: list[str], staging: Staging, *, num_shards: int = 1,
                 match_shards: bool = False, fmt: str | None = None,
                 writer_options: str = "group_size:1", overwrite: bool = False) -> None:
        super().__init__()
        self.files, self.staging, self.fmt = list(files), staging, fmt
        self.num_shards = len(self.files) if match_shards else num_shards
        self.match_shards, self.writer_options, self.overwrite = match_shards, writer_options, overwrite
        for path in self.files:  # a bad extension fails here, before any work
            record_format(path, fmt)
        self.plans = matched_plans(staging.prefix, self.files) if match_shards else None

    def expand(self, pbegin: Any) -> Any:
        if self.plans is not None:
            plans = pbegin | "Plans" >> beam.Create(self.plans)
        else:
            plans = (
                pbegin
                | "Files" >> beam.Create(range(len(self.files)))
                | "SpreadFiles" >> beam.Reshuffle()
                | "Count" >> beam.ParDo(_CountRecords(self.files, self.fmt))
                | "AllCounts" >> beam.combiners.ToList()
                | "Plan" >> beam.FlatMap(_plan, self.staging.prefix, self.num_shards, self.staging)
            )
        return (
            plans
            | "SpreadShards" >> beam.Reshuffle()
            | "Write" >> beam.ParDo(_WriteShard(self.files, self.fmt, self.staging, self.writer_options))
            | "AllShards" >> beam.combiners.ToList()
            | "Commit" >> beam.ParDo(_Commit(self.staging, self.num_shards, self.overwrite))
        )


class _ReadFile(beam.DoFn):
    def __init__(self, files: list[str], fmt: str | None) -> None:
        self.files, self.fmt = files, fmt

    def process(self, file_index: int) -> Iterator[tuple[tuple[int, int], bytes]]:
        plan = ShardPlan(file_index, "", ((file_index, 0, None),))
        for position, record in enumerate(_records(self.files, self.fmt, plan)):
            yield (file_index, position), record


class ReadRecordFiles(beam.PTransform):
    """Reads record files as ``((file index, record index), bytes)`` elements.

    The records are encoded as ``convert`` encodes them (see
    :mod:`dataloader.beam.record_files`); the keys say their order, which
    :class:`~dataloader.beam.sink.WriteToArrayRecord` keeps within each shard.

    Args:
        files: the input files, in order (see ``files.expand_inputs``).
        fmt: the input format, or ``None`` to tell by each file's extension.

    Example:
        >>> with beam.Pipeline() as p:  # doctest: +SKIP
        ...     _ = (p | ReadRecordFiles(["a.jsonl", "b.jsonl"])
        ...          | WriteToArrayRecord("out/ab", num_shards=2))
    """

    def __init__(self, files: list[str], fmt: str | None = None) -> None:
        super().__init__()
        self.files, self.fmt = list(files), fmt
        for path in self.files:
            record_format(path, fmt)

    def expand(self, pbegin: Any) -> Any:
        return (
            pbegin
            | "Files" >> beam.Create(range(len(self.files)))
            | "SpreadFiles" >> beam.Reshuffle()
            | "Read" >> beam.ParDo(_ReadFile(self.files, self.fmt))
        )
