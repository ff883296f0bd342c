"""The command line, on absl: ``python -m dataloader run|inspect|convert|demo``.

::

    python -m dataloader run CONFIG [key.sub=value ...] [--max_batches=N] [--report=DIR] [--step_ms=MS]
    python -m dataloader inspect PATH_OR_GLOB ... [--index=I] [--records=N]
    python -m dataloader convert INPUT ... --output=PREFIX [--num_shards=N] [--group_size=1]
                                           [--format=jsonl|parquet|npy|npz]
    python -m dataloader demo [key=value ...] [--demo=lm|digits] [--out_dir=demo_out] [--config=...]

``run`` iterates a pipeline config with a progress bar on stderr, then reports the
records read, elements and batches out, the time to the first batch, the waiting, each
worker's busy share, where the time went and advice, from the iterator's ``stats()``
(:mod:`dataloader.cli.run`; ``--report=DIR`` also writes an HTML page and
``stats.json``, :mod:`dataloader.cli.report`). A config error is printed as one line
naming the key, with exit status 2.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from absl import app, flags, logging

from dataloader.cli.convert import FORMATS, convert
from dataloader.cli.run import run_command
from dataloader.errors import ConfigError

COMMANDS = ("run", "inspect", "convert", "demo")

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
_NUM_SHARDS = flags.DEFINE_integer("num_shards", 1, "convert: number of output shards", lower_bound=1)
_GROUP_SIZE = flags.DEFINE_integer(
    "group_size", 1, "convert: ArrayRecord group size (1 gives fast random access)", lower_bound=1)
_FORMAT = flags.DEFINE_enum("format", None, FORMATS, "convert: input format (default: by extension)")
_OUT_DIR = flags.DEFINE_string("out_dir", "demo_out", "demo: where data and checkpoints go")
_CONFIG = flags.DEFINE_string(
    "config", None, "demo: the config (default: configs/lm_demo.yaml, or configs/demo.yaml for digits)")
_DEMO = flags.DEFINE_enum(
    "demo", "lm", ["lm", "digits"], "demo: the language model on the standard library's text (lm), "
    "or the MLP on scikit-learn's digits (digits)")


def main(argv: Sequence[str]) -> int:
    """The absl entry point: ``argv[1]`` is the command, the rest its arguments."""
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # Orbax and JAX are chatty at INFO
    if len(argv) < 2 or argv[1] not in COMMANDS:
        raise app.UsageError(f"expected a command, one of {', '.join(COMMANDS)}; got {argv[1:2] or 'none'}")
    command, args = argv[1], list(argv[2:])
    try:
        if command == "run":
            print(run_command(args, _MAX_BATCHES.value, _REPORT.value, _STEP_MS.value), flush=True)
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
            if not args or not _OUTPUT.value:
                raise app.UsageError("convert needs input files and --output=PREFIX")
            paths = convert(args, _OUTPUT.value, num_shards=_NUM_SHARDS.value,
                            group_size=_GROUP_SIZE.value, fmt=_FORMAT.value)
            print("\n".join(["wrote", *(f"  {p}" for p in paths)]))
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


def run() -> None:
    """Console entry: parses flags and runs :func:`main`."""
    app.run(main)
