"""What the benchmark scripts share: re-running in ``benchmarks/.venv`` (made by
``setup_env.sh``), where the peers they measure are installed, and running one row in a
fresh interpreter."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
VENV = HERE / ".venv"


def ensure_venv(script: str, argv: list[str]) -> None:
    """Makes the environment if needed and re-executes ``script`` with ``argv`` in it;
    returns at once when already running there."""
    if Path(sys.prefix).resolve() == VENV.resolve():
        return
    subprocess.run(["bash", str(HERE / "setup_env.sh")], check=True)
    python = VENV / "bin" / "python"
    os.execv(str(python), [str(python), str(Path(script).resolve()), *argv])


def run_row(script: str, request: dict, timeout: float, env: dict[str, str] | None = None) -> dict:
    """Runs ``script --measure REQUEST`` in a fresh interpreter (with the environment
    ``env``, else this one's) and returns the JSON object on the last such line of its
    output, or ``{"ok": False, "reason": ...}`` (timed out, crashed, no answer)."""
    command = [sys.executable, str(Path(script).resolve()), "--measure", json.dumps(request)]
    # A new session, so that on timeout the whole group we started can be ended.
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, env=env
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        return {"ok": False, "reason": f"timed out after {timeout:.0f}s"}
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                break
    tail = [line for line in stderr.strip().splitlines() if line.strip()] or ["no output"]
    return {"ok": False, "reason": f"exit {process.returncode}: {tail[-1][:200]}"}


def add_tree_option(parser: argparse.ArgumentParser) -> None:
    """``--tree NAME=PATH`` (repeat it): the checkouts a side-by-side run measures."""
    parser.add_argument("--tree", action="append", default=[], help="NAME=PATH of a checkout to measure")


def side_by_side(parser: argparse.ArgumentParser, child: Callable[[argparse.Namespace], dict],
                 child_type: type = str) -> tuple[argparse.Namespace, list[list[str]]] | None:
    """Parses a side-by-side benchmark's arguments, with ``--tree`` and the hidden
    ``--child ROW`` of :func:`run_in_tree`. In a child, prints the JSON of ``child(args)``
    (one row) and returns None; else returns the arguments and the checkouts."""
    add_tree_option(parser)
    parser.add_argument("--child", type=child_type, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args)))
        return None
    return args, trees_of(args)


def trees_of(args: argparse.Namespace) -> list[list[str]]:
    """The ``--tree`` checkouts as ``[name, path]``, or this one (``this``) when none is given."""
    return [t.split("=", 1) for t in args.tree] or [["this", str(HERE.parent)]]


def run_in_tree(script: str, tree: str, arguments: list[str], timeout: float = 600) -> dict:
    """``script arguments`` in a fresh interpreter that imports the project from the
    checkout ``tree`` (first on the path, and the working directory): one row of a
    side-by-side run against other checkouts (the code before a change). Returns the JSON
    object on the last line it prints; raises with its stderr when it fails."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tree, str(Path(script).resolve().parent)]))
    out = subprocess.run(
        [sys.executable, str(Path(script).resolve()), *arguments],
        env=env, cwd=tree, capture_output=True, text=True, timeout=timeout,
    )
    if out.returncode:
        raise RuntimeError(f"{Path(script).name} {' '.join(arguments)} in {tree} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])
