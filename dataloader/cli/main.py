"""The command line, on absl: ``python -m dataloader run|inspect|convert|demo``.

::

    python -m dataloader run CONFIG [key.sub=value ...] [--max_batches=N]
    python -m dataloader inspect PATH_OR_GLOB ... [--index=I]
    python -m dataloader convert INPUT ... --output=PREFIX [--num_shards=N | --match_shards]
                                           [--group_size=1] [--format=tfrecord|jsonl|csv|...]
                                           [--overwrite] [--verify] [--BEAM_OPTION=VALUE ...]
    python -m dataloader demo [key=value ...] [--demo=lm|digits] [--out_dir=demo_out] [--config=...]

``run`` iterates a pipeline config with a progress bar on stderr, then reports
records/s, the time to the first batch and where the time went (reading, batching,
each operation, waiting on workers) from the iterator's ``stats()``. A config error
is printed as one line naming the key, with exit status 2.

``convert`` runs the Apache Beam pipeline of :mod:`dataloader.beam`. Flags it does not
know are handed to Beam as pipeline options (``--runner=DataflowRunner
--project=...``, ``--direct_num_workers=2``; write them as ``--name=value``), which is
why flags are parsed with ``known_only``: the other commands refuse unknown flags
themselves. Without Beam installed, ``convert`` falls back to the single-process
converter of :mod:`dataloader.cli.convert` (same output) unless Beam options or
``--match_shards`` ask for the pipeline.
"""

from __future__ import annotations

import itertools
import logging as std_logging
import sys
import time
from collections.abc import Sequence
from typing import Any

from absl import app, flags, logging

from dataloader.cli.progress import Progress
from dataloader.engine.stats import sorted_stages
from dataloader.errors import ConfigError
from dataloader.operations import FilterTransform, FlatMapTransform
from dataloader.options import AutoWorkers
from dataloader.samplers.sharding import shard_length
from dataloader.sources.record_files import FORMATS

COMMANDS = ("run", "inspect", "convert", "demo")

_MAX_BATCHES = flags.DEFINE_integer(
    "max_batches", None, "run: stop after this many batches (default: the whole stream, "
    "or one epoch's worth when it repeats for ever)", lower_bound=1)
_INDEX = flags.DEFINE_integer("index", 0, "inspect: which record to show")
_OUTPUT = flags.DEFINE_string(
    "output", None, "convert: output prefix; shards are PREFIX-0000i-of-0000N.array_record")
_NUM_SHARDS = flags.DEFINE_integer(
    "num_shards", None, "convert: number of contiguous output shards (default 1)", lower_bound=1)
_MATCH_SHARDS = flags.DEFINE_boolean(
    "match_shards", False, "convert: one output shard per input file, PREFIX-<file name>.array_record")
_GROUP_SIZE = flags.DEFINE_integer(
    "group_size", 1, "convert: ArrayRecord group size (1 gives fast random access)", lower_bound=1)
_FORMAT = flags.DEFINE_enum("format", None, FORMATS, "convert: input format (default: by extension)")
_OVERWRITE = flags.DEFINE_boolean(
    "overwrite", False, "convert: replace an existing output (all of PREFIX-*.array_record)")
_VERIFY = flags.DEFINE_boolean(
    "verify", False, "convert: read the output back and compare counts and checksums")
_OUT_DIR = flags.DEFINE_string("out_dir", "demo_out", "demo: where data and checkpoints go")
_CONFIG = flags.DEFINE_string(
    "config", None, "demo: the config (default: configs/lm_demo.yaml, or configs/demo.yaml for digits)")
_DEMO = flags.DEFINE_enum(
    "demo", "lm", ["lm", "digits"], "demo: the language model on the standard library's text (lm), "
    "or the MLP on scikit-learn's digits (digits)")


def _count_records(batch: Any) -> int:
    """The leading size of the first array leaf (1 for an unbatched element)."""
    while isinstance(batch, (dict, list, tuple)) and batch:
        batch = next(iter(batch.values())) if isinstance(batch, dict) else batch[0]
    shape = getattr(batch, "shape", ())
    return int(shape[0]) if shape else 1


def _default_limit(loader: Any) -> tuple[int | None, str]:
    """Batches to run when --max_batches is not given, and why."""
    sampler, batch = loader.sampler, loader.plan.batch
    per_batch = batch.batch_size if batch is not None else 1
    if sampler.num_positions is not None:
        return None, "the whole stream"
    shard = sampler.shard_options
    epoch = shard_length(sampler.num_records, shard.shard_index, shard.shard_count, shard.drop_remainder)
    return max(1, epoch // per_batch), "one epoch's worth (the stream repeats for ever)"


def _output_count_unknown(plan: Any) -> bool:
    """True when a filter or flat map (before or after the batch) makes the count unknown."""
    return any(isinstance(step.op, (FilterTransform, FlatMapTransform)) for step in (*plan.pre, *plan.post))


def _expected_batches(loader: Any, limit: int | None) -> int | None:
    """How many outputs the run will see, when that is known in advance."""
    positions, batch = loader.sampler.num_positions, loader.plan.batch
    if positions is None or _output_count_unknown(loader.plan):  # unknown until run
        return limit
    total = positions
    if batch is not None:
        full, rest = divmod(positions, batch.batch_size)
        total = full + (1 if rest and not batch.drop_remainder else 0)
    return total if limit is None else min(total, limit)


def report(
    stats: dict[str, Any], batches: int, records: int, elapsed: float, first_batch_s: float | None,
    workers: int | AutoWorkers,
) -> str:
    """The summary ``run`` prints: throughput, first batch and where the time went."""
    share = f"{stats['wait_s'] / elapsed:.0%}" if elapsed > 0 else "0%"
    pool = "the auto-sized pool" if isinstance(workers, AutoWorkers) else f"{workers} worker(s)"
    waited = (
        f"waiting        {stats['wait_s']:.2f} s blocked on {pool} ({share} of the run)"
        if workers else f"computing      {stats['wait_s']:.2f} s in this process, no workers ({share} of the run)"
    )
    lines = [
        f"batches        {batches:,} ({records:,} records) in {elapsed:.2f} s",
        f"records/s      {records / elapsed if elapsed > 0 else 0.0:,.0f}",
        f"first batch    {first_batch_s:.3f} s" if first_batch_s is not None else "first batch    none",
        waited,
        "where the time went (seconds of work, added up over worker processes):",
    ]
    stages = sorted_stages(stats)
    work = sum(secs for _, secs in stages) or 1.0
    width = max((len(name) for name, _ in stages), default=4)
    lines += [f"  {name:<{width}}  {secs:8.3f} s  {secs / work:6.1%}" for name, secs in stages]
    return "\n".join(lines)


def run_command(args: Sequence[str], max_batches: int | None = None) -> str:
    """``run CONFIG [overrides]``: iterates the pipeline; returns the report."""
    from dataloader.config.pipeline import load_config

    if not args:
        raise app.UsageError("run needs a config: python -m dataloader run CONFIG [key.sub=value ...]")
    config = load_config(args[0], args[1:])
    began = time.perf_counter()
    loader = config.build_loader()
    limit, why = (max_batches, f"--max_batches={max_batches}") if max_batches else _default_limit(loader)
    base = loader.iterator()
    it = config.on_device(base)
    batches = records = 0
    first_batch_s = None
    try:
        with Progress(f"run {args[0]}", total=_expected_batches(loader, limit), unit="batches") as bar:
            for batch in itertools.islice(it, limit):
                if first_batch_s is None:
                    first_batch_s = time.perf_counter() - began
                batches += 1
                records += _count_records(batch)
                bar.update()
        elapsed = time.perf_counter() - began
        stats = base.stats()
    finally:
        it.close()
    header = f"ran {why} of {args[0]}" + (f" with {' '.join(args[1:])}" if args[1:] else "")
    return header + "\n" + report(stats, batches, records, elapsed, first_batch_s, loader.worker_count)


def convert_command(args: Sequence[str]) -> str:
    """``convert INPUT ... --output=PREFIX``: runs the Beam pipeline; returns the report."""
    inputs = [a for a in args if not a.startswith("-")]
    beam_args = [a for a in args if a.startswith("-")]
    output = _OUTPUT.value
    if not inputs or not output:
        raise app.UsageError("convert needs input files and --output=PREFIX")
    if _MATCH_SHARDS.value and _NUM_SHARDS.value is not None:
        raise app.UsageError("pass either --num_shards or --match_shards, not both")
    try:
        from dataloader.beam import convert, verify
    except ImportError as error:
        if error.name != "apache_beam":  # Beam is there, something else is broken
            raise
        return _convert_without_beam(inputs, output, beam_args)

    # Errors come back to us as one clear ConvertError; Beam's own logging of the same
    # failure (tracebacks from each worker) would bury it.
    std_logging.getLogger("apache_beam").setLevel(std_logging.CRITICAL)
    if not any(a.startswith("--default_sdk_harness_log_level") for a in beam_args):
        beam_args.append("--default_sdk_harness_log_level=CRITICAL")
    result = convert(inputs, output, num_shards=_NUM_SHARDS.value, match_shards=_MATCH_SHARDS.value,
                     group_size=_GROUP_SIZE.value, fmt=_FORMAT.value, overwrite=_OVERWRITE.value,
                     pipeline_args=beam_args)
    rate = result.num_records / result.seconds if result.seconds else 0.0
    lines = [f"wrote {len(result.shards)} shard(s), {result.num_records:,} records in "
             f"{result.seconds:.1f} s ({rate:,.0f} records/s)"]
    width = max(len(s.path) for s in result.shards)
    lines += [f"  {s.path:<{width}}  {s.count:>12,} records" for s in result.shards]
    if _VERIFY.value:
        lines += ["verified (read back with ArrayRecordDataSource):", *(f"  {v}" for v in verify(result))]
    return "\n".join(lines)


def _convert_without_beam(inputs: list[str], output: str, beam_args: list[str]) -> str:
    if beam_args or _MATCH_SHARDS.value or _VERIFY.value:
        wanted = " ".join(beam_args) or ("--match_shards" if _MATCH_SHARDS.value else "--verify")
        raise app.UsageError(f"{wanted} needs Apache Beam; install it with pip install 'granary[beam]'")
    from dataloader.cli.convert import convert

    print("Apache Beam is not installed: converting in this process "
          "(pip install 'granary[beam]' for the pipeline)", file=sys.stderr)
    paths = convert(inputs, output, num_shards=_NUM_SHARDS.value or 1,
                    group_size=_GROUP_SIZE.value, fmt=_FORMAT.value, overwrite=_OVERWRITE.value)
    return "\n".join(["wrote", *(f"  {p}" for p in paths)])


def main(argv: Sequence[str]) -> int:
    """The absl entry point: ``argv[1]`` is the command, the rest its arguments."""
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # Orbax and JAX are chatty at INFO
    if len(argv) < 2 or argv[1] not in COMMANDS:
        raise app.UsageError(f"expected a command, one of {', '.join(COMMANDS)}; got {argv[1:2] or 'none'}")
    command, args = argv[1], list(argv[2:])
    unknown = [a for a in args if a.startswith("-")]
    if unknown and command != "convert":  # flags are parsed known_only, for convert's sake
        raise app.UsageError(f"unknown flag(s) for {command}: {' '.join(unknown)}")
    try:
        if command == "run":
            print(run_command(args, _MAX_BATCHES.value), flush=True)
        elif command == "inspect":
            from dataloader.cli.inspect_records import describe_array_records

            if not args:
                raise app.UsageError("inspect needs ArrayRecord paths or globs")
            print(describe_array_records(args, _INDEX.value))
        elif command == "convert":
            print(convert_command(args), flush=True)
        elif _DEMO.value == "digits":
            from dataloader.demo.main import main as digits_main

            return digits_main(_OUT_DIR.value, _CONFIG.value, args)
        else:
            from dataloader.demo.lm import main as lm_main

            return lm_main(_OUT_DIR.value, _CONFIG.value, args)
    except ConfigError as error:
        print(f"config error: {error}", file=sys.stderr)
        return 2
    except (FileNotFoundError, IndexError, ValueError) as error:
        if command not in ("inspect", "convert"):
            raise
        print(f"{command}: {error}", file=sys.stderr)
        return 2
    return 0


def parse_flags(argv: list[str]) -> list[str]:
    """absl's parsing, leaving flags it does not know in the arguments (for Beam)."""
    try:
        return flags.FLAGS(argv, known_only=True)
    except flags.Error as error:
        print(f"FATAL Flags parsing error: {error}", file=sys.stderr)
        print("Pass --helpshort or --helpfull to see help on flags.", file=sys.stderr)
        sys.exit(1)


def run() -> None:
    """Console entry: parses flags and runs :func:`main`."""
    app.run(main, flags_parser=parse_flags)
