"""The command line, on absl: ``python -m dataloader run|inspect|convert|demo|audit|index``.

::

    python -m dataloader run CONFIG [key.sub=value ...] [--max_batches=N] [--report=DIR] [--step_ms=MS]
    python -m dataloader inspect PATH_OR_GLOB ... [--index=I] [--records=N]
    python -m dataloader convert INPUT ... --output=PREFIX [--num_shards=N | --match_shards]
                                           [--group_size=1] [--format=tfrecord|jsonl|csv|...]
                                           [--overwrite] [--verify] [--BEAM_OPTION=VALUE ...]
    python -m dataloader demo [key=value ...] [--demo=lm|digits] [--out_dir=demo_out] [--config=...]
    python -m dataloader audit LOG_A LOG_B
    python -m dataloader index PATH_OR_GLOB_OR_URL ... [--index_path=PATH_OR_URL]
                                                       [--kind=array_record|parquet|tfrecord|jsonl]
                                                       [--storage_options=JSON]

``CONFIG`` is a YAML file, or the name of a config shipped with granary
(``array_record_images``, ``parquet``, ``demo``: :func:`dataloader.config.shipped_config`),
found through the package from any working directory.

``run`` iterates a pipeline config with a progress bar on stderr, then reports the
records read, elements and batches out, the time to the first batch, the waiting, each
worker's busy share, where the time went and advice, from the iterator's ``stats()``
(:mod:`dataloader.cli.run`; ``--report=DIR`` also writes an HTML page and
``stats.json``, :mod:`dataloader.cli.report`). A config error is printed as one line
naming the key, with exit status 2.

``audit`` compares two audit logs (``DataLoader(..., audit_log=path)``) and reports the
first step where they differ, exit status 1 (:mod:`dataloader.cli.audit`).

``index`` reads each file's metadata (record counts, chunk indices, footers, record and
line offsets) once and writes the metadata index every source reads instead
(:mod:`dataloader.cli.index`, :mod:`dataloader.sources.files.metadata_index`).

``convert`` runs the Apache Beam pipeline of :mod:`dataloader.beam`. Flags it does not
know are handed to Beam as pipeline options (``--runner=DataflowRunner
--project=...``, ``--direct_num_workers=2``; write them as ``--name=value``), which is
why flags are parsed with ``known_only``: the other commands refuse unknown flags
themselves. Without Beam installed, ``convert`` falls back to the single-process
converter of :mod:`dataloader.cli.convert` (same output) unless Beam options or
``--match_shards`` ask for the pipeline.
"""

from __future__ import annotations

import logging as std_logging
import sys
from collections.abc import Sequence

from absl import app, flags, logging

from dataloader.beam.record_files import FORMATS
from dataloader.cli.run import run_command
from dataloader.errors import ConfigError

COMMANDS = ("run", "inspect", "convert", "demo", "audit", "index")

_MAX_BATCHES = flags.DEFINE_integer(
    "max_batches", None, "run: stop after this many batches (default: the whole stream, "
    "or one epoch's worth when it repeats for ever)", lower_bound=1)
_REPORT = flags.DEFINE_string(
    "report", None, "run: also write DIR/report.html (plots; needs the report extra, matplotlib) "
    "and DIR/stats.json")
_STEP_MS = flags.DEFINE_float(
    "step_ms", None, "run: sleep this many ms after each batch, as a training step would, so "
    "the waiting share says whether the loader keeps up", lower_bound=0)
_INDEX = flags.DEFINE_integer("index", 0, "inspect: the first record to show")
_RECORDS = flags.DEFINE_integer("records", 3, "inspect: how many records to show", lower_bound=1)
_DECODE = flags.DEFINE_string(
    "decode", None, "inspect: import path of a function of a record (e.g. the pipeline's first map) "
    "whose result to show, e.g. dataloader.demo.data.decode_digit")
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
_INDEX_PATH = flags.DEFINE_string(
    "index_path", None, "index: the index file to write, a path or URL (default: "
    "_granary_index.json beside the data, in each file's directory)")
_KIND = flags.DEFINE_enum(
    "kind", None, ["array_record", "parquet", "tfrecord", "jsonl"],
    "index: the files' format (default: by extension)")
_STORAGE_OPTIONS = flags.DEFINE_string(
    "storage_options", None, "index: for URLs, the fsspec file system's options as JSON, "
    "e.g. '{\"endpoint_url\": \"http://127.0.0.1:9000\"}'")
_CONFIG = flags.DEFINE_string(
    "config", None, "demo: the config, a YAML file or a shipped config's name (default: lm_demo, or demo for digits)")
_DEMO = flags.DEFINE_enum(
    "demo", "lm", ["lm", "digits"], "demo: the language model on the standard library's text (lm), "
    "or the MLP on scikit-learn's digits (digits)")


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
        if command == "audit":  # two audit logs: the first step where they differ
            from dataloader.cli.audit import audit_command

            report, status = audit_command(args)
            print(report, file=sys.stderr if status == 2 else sys.stdout, flush=True)
            return status
        if command == "run":
            print(run_command(args, _MAX_BATCHES.value, _REPORT.value, _STEP_MS.value), flush=True)
        elif command == "index":
            from dataloader.cli.index import build_index, parse_storage_options

            if not args:
                raise app.UsageError("index needs the paths, globs or URLs of the data files")
            print(build_index(args, _INDEX_PATH.value, _KIND.value,
                              parse_storage_options(_STORAGE_OPTIONS.value)), flush=True)
        elif command == "inspect":
            from dataloader.cli.inspect_records import describe_array_records

            if not args:
                raise app.UsageError("inspect needs ArrayRecord paths or globs")
            decode = None
            if _DECODE.value:
                from dataloader.config.import_path import resolve_import

                decode = resolve_import(_DECODE.value)
            print(describe_array_records(args, _INDEX.value, _RECORDS.value, decode))
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
        if command not in ("inspect", "convert", "index"):
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
