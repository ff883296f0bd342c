"""``python -m dataloader.compat script.py [args]``: run Grain code on granary, unchanged.

Installs the grain alias (:func:`~dataloader.compat.install_grain_alias`), then runs
the script as ``python script.py [args]`` would: as ``__main__``, with ``sys.argv``
``[script.py, args...]`` and the script's folder first on ``sys.path``. ``-m module
[args]`` and ``-c code [args]`` run a module or a string the same way.
"""

from __future__ import annotations

import os
import runpy
import sys
import types

from dataloader.compat.alias import install_grain_alias

USAGE = "usage: python -m dataloader.compat (script.py | -m module | -c code) [args ...]"


def main(argv: list[str]) -> None:
    """Runs ``argv`` (what follows ``-m dataloader.compat``) with the alias installed."""
    if not argv or argv[0] in ("-h", "--help") or (argv[0] in ("-m", "-c") and len(argv) < 2):
        print(USAGE, file=sys.stderr)
        raise SystemExit(0 if argv and argv[0] in ("-h", "--help") else 2)
    install_grain_alias()
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]  # runpy puts the module's file in argv[0]
        sys.path[0] = os.getcwd()
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    elif argv[0] == "-c":
        sys.argv = ["-c", *argv[2:]]
        sys.path[0] = ""
        _run_code(argv[1])
    else:
        script = argv[0]
        if not os.path.exists(script):
            raise SystemExit(f"python -m dataloader.compat: can't open file {script!r}: no such file")
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        runpy.run_path(script, run_name="__main__")


def _run_code(code: str) -> None:
    # A fresh __main__ module, as `python -c` has: functions defined in the code are
    # pickled by value (cloudpickle looks for __main__), and ours stays untouched.
    module = types.ModuleType("__main__")
    module.__dict__["__builtins__"] = __builtins__
    saved = sys.modules["__main__"]
    sys.modules["__main__"] = module
    try:
        exec(compile(code, "<string>", "exec"), module.__dict__)
    finally:
        sys.modules["__main__"] = saved


if __name__ == "__main__":
    main(sys.argv[1:])
