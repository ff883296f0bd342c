"""The converter's driver: options, the run, progress, errors, cleanup and ``--verify``.

:func:`convert` checks everything it can before the pipeline starts (inputs exist and
have a known format, the output prefix is free or ``overwrite`` is set, the Beam
options parse), runs the pipeline on the runner the options name (the DirectRunner by
default), draws a progress bar for local output, and afterwards removes the staging
folder whatever happened. A failure inside the pipeline reaches the caller as the
:class:`~dataloader.errors.ConvertError` the worker raised (runners wrap it in their own
exception, with the worker's traceback as text).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import threading
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from dataloader.beam.files import check_prefix, existing_outputs, expand_inputs, is_local
from dataloader.beam.pipeline import ConvertToArrayRecord
from dataloader.beam.plan import refusal
from dataloader.beam.sink import Checksum, ShardResult, Staging, read_summary
from dataloader.engine.stats.progress import Progress
from dataloader.errors import ConvertError

_WORKER_ERROR = re.compile(r"ConvertError: (.+?)(?: \[while running '[^\]]*'\])?$", re.M)


@dataclass(frozen=True)
class ConvertResult:
    """What a conversion wrote: one :class:`ShardResult` per shard, and the time it took."""

    shards: list[ShardResult]
    seconds: float

    @property
    def paths(self) -> list[str]:
        return [s.path for s in self.shards]

    @property
    def num_records(self) -> int:
        return sum(s.count for s in self.shards)


def pipeline_options(args: Sequence[str]) -> PipelineOptions:
    """Beam options from ``--name=value`` flags; refuses a flag Beam does not know.

    Raises:
        ConvertError: a flag that is not a Beam pipeline option.
    """
    options = PipelineOptions(list(args))
    complaint = io.StringIO()
    try:
        with contextlib.redirect_stderr(complaint):  # argparse prints Beam's whole usage first
            known = options.get_all_options(retain_unknown_options=False)
            every = options.get_all_options(retain_unknown_options=True)
    except SystemExit:
        reason = complaint.getvalue().strip().splitlines()[-1].split("error: ", 1)[-1]
        raise ConvertError(
            f"Beam pipeline options: {reason} (write them as --name=value)"
        ) from None
    unknown = sorted(set(every) - set(known))
    if unknown:
        raise ConvertError(
            f"unknown flag(s) {', '.join('--' + name for name in unknown)}: neither a convert "
            "flag nor an Apache Beam pipeline option (write Beam options as --name=value)"
        )
    return options


def _worker_error(error: BaseException) -> ConvertError | None:
    """The ConvertError a worker raised, from the runner's exception (or its text)."""
    text = str(error)
    if isinstance(error, ConvertError):  # in-process runners re-raise it, message augmented
        return ConvertError(re.sub(r" \[while running '[^\]]*'\]$", "", text))
    found = _WORKER_ERROR.search(text)
    return ConvertError(found.group(1)) if found else None


class _ProgressWatcher:
    """Sums the counts local shard writers leave in the staging folder, for a progress bar."""

    def __init__(self, staging: Staging, bar: Progress) -> None:
        self.staging, self.bar, self._stop = staging, bar, threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        folder, done = self.staging.folder, 0
        names = os.listdir(folder) if os.path.isdir(folder) else []
        for name in names:
            if name != "total" and not (name.startswith("progress-") and "." not in name):
                continue  # a staged shard, or a progress file being replaced
            try:
                with open(os.path.join(folder, name)) as f:
                    value = int(f.read() or 0)
            except (OSError, ValueError):
                continue
            if name == "total":
                self.bar.total = value
            else:
                done += value
        self.bar.update(done - self.bar.count)

    def _loop(self) -> None:
        while not self._stop.wait(0.25):
            self._poll()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._poll()


def convert(
    inputs: Sequence[str],
    output: str,
    *,
    num_shards: int | None = None,
    match_shards: bool = False,
    group_size: int = 1,
    fmt: str | None = None,
    overwrite: bool = False,
    pipeline_args: Sequence[str] = (),
    progress: bool = True,
) -> ConvertResult:
    """Converts ``inputs`` to ArrayRecord shards ``output-...`` on Apache Beam.

    Args:
        inputs: files or globs (local, or on any Beam file system).
        output: the output prefix (``out/train``).
        num_shards: contiguous output shards (default 1); not with ``match_shards``.
        match_shards: one output shard per input file, named after it.
        group_size: ArrayRecord group size (1: fast random access).
        fmt: the input format (default: by each file's extension).
        overwrite: replace all of an existing output ``output-*.array_record``.
        pipeline_args: Beam pipeline options, e.g. ``["--runner=DirectRunner",
            "--direct_num_workers=2", "--direct_running_mode=multi_processing"]``.
        progress: draw a progress bar on stderr (local output only).

    Returns:
        The shards written, with their counts and checksums.

    Raises:
        ConvertError: bad input (naming the file and where), an existing output
            without ``overwrite``, or an unknown flag.
        FileNotFoundError: an input does not exist or a glob matches nothing.
        ValueError: bad arguments.
    """
    if match_shards and num_shards is not None:
        raise ValueError("pass either num_shards or match_shards, not both")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive integer, got {group_size!r}")
    num_shards = 1 if num_shards is None else num_shards
    if isinstance(num_shards, bool) or not isinstance(num_shards, int) or num_shards < 1:
        raise ValueError(f"num_shards must be a positive integer, got {num_shards!r}")
    options = pipeline_options(pipeline_args)
    files = expand_inputs(list(inputs))
    staging = Staging(check_prefix(output), os.urandom(6).hex())
    existing = existing_outputs(output)
    if existing and not overwrite:
        raise ConvertError(refusal(existing))
    writer_options = f"group_size:{group_size}"
    transform = ConvertToArrayRecord(files, staging, num_shards=num_shards, match_shards=match_shards,
                                     fmt=fmt, writer_options=writer_options, overwrite=overwrite)
    began = time.perf_counter()
    watcher = None
    try:
        if progress and is_local(output):
            staging.create()
            watcher = _ProgressWatcher(staging, Progress(f"converting to {transform.num_shards} shard(s)"))
        pipeline = beam.Pipeline(options=options)
        _ = pipeline | "Convert" >> transform
        try:
            pipeline.run().wait_until_finish()
        except Exception as error:
            found = _worker_error(error)
            if found is None:
                raise
            raise found from error
        finally:
            if watcher is not None:
                watcher.stop()
                watcher.bar.close()
        shards = read_summary(staging)
    finally:
        staging.remove()
    return ConvertResult(shards, time.perf_counter() - began)


def verify(result: ConvertResult) -> list[str]:
    """Reads every shard back and compares its count and checksum with what was written.

    Returns:
        One line per shard, saying what was checked.

    Raises:
        ConvertError: a shard differs; ValueError: a shard is not on this machine.
    """
    from dataloader.sources import ArrayRecordDataSource

    lines = []
    for shard in result.shards:
        if not is_local(shard.path):
            raise ValueError(f"--verify reads local files only; {shard.path} is not one")
        with warnings.catch_warnings():  # group_size > 1 warns about random access: not relevant
            warnings.simplefilter("ignore", UserWarning)
            source = ArrayRecordDataSource(shard.path)
        checksum = Checksum()
        for start in range(0, len(source), 4096):
            for record in source.__getitems__(range(start, min(start + 4096, len(source)))):
                checksum.add(record)
        if (checksum.count, checksum.hexdigest()) != (shard.count, shard.checksum):
            raise ConvertError(
                f"{shard.path} reads back {checksum.count} records with checksum "
                f"{checksum.hexdigest()}, but {shard.count} records with checksum "
                f"{shard.checksum} were written"
            )
        lines.append(f"{shard.path}: {checksum.count:,} records, checksum {checksum.hexdigest()} ok")
    return lines
