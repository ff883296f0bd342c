"""A resume-correctness matrix: granary and its peers on the same preemptions.

Each cell is one loader (a column, used the way its documentation says to checkpoint
it) on one scenario (a row): the same records (each carrying its id) through the same
pipeline as far as the loader allows. The uninterrupted reference run, the interrupted
run and the resume each run in a fresh process (``--child``); the ids each step
handed out are compared: records lost, records repeated, and whether the order after
the resume equals the reference's (which counts where the loader promises an order).

    python3 benchmarks/resume_matrix.py                    # the full matrix (benchmarks/.venv)
    python3 benchmarks/resume_matrix.py --quick            # CI-sized
    python3 benchmarks/resume_matrix.py --loaders granary,grain --scenarios mid_epoch,filter
    python3 benchmarks/resume_matrix.py --json matrix.json --markdown matrix.md
    python benchmarks/resume_matrix.py --here --loaders granary   # in this interpreter

A column whose loader cannot be installed beside granary (mosaic-streaming) runs its
processes, and writes its data, in an environment of its own (``Column.environment``,
made by benchmarks/setup_env.sh); ``--here`` runs every column in this interpreter.

The scenarios, the columns and what a cell means: docs/resume-matrix.md.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import importlib
import json
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from resume import common, data  # noqa: E402
from resume.base import versions  # noqa: E402

COLUMNS = {
    "granary": "resume.granary_cols:GranaryLoader",
    "granary-dataset": "resume.granary_cols:GranaryDataset",
    "grain": "resume.grain_cols:GrainLoader",
    "grain-dataset": "resume.grain_cols:GrainDataset",
    "torchdata": "resume.torch_cols:StatefulLoader",
    "hf-iterable": "resume.hf_cols:HfIterable",
    "hf-map": "resume.hf_cols:HfMap",
    "litdata": "resume.litdata_cols:LitData",
    "mosaic-streaming": "resume.mosaic_cols:MosaicStreaming",
}
BASE = ("mid_epoch", "sigkill", "worker_count", "worker_replaced", "source_changed")


def column(name: str) -> Any:
    module, cls = COLUMNS[name].split(":")
    return getattr(importlib.import_module(module), cls)()


def interpreter(col: Any, here: bool) -> str:
    """The Python a column's processes run in: its own environment's (unless ``--here``)."""
    if here or not col.environment:
        return sys.executable
    return str(HERE / col.environment / "bin" / "python")


def in_interpreter(python: str, mode: str, payload: dict, timeout: float) -> dict:
    """Runs ``resume_matrix.py --MODE PAYLOAD`` in ``python``; its last line of output, JSON."""
    if not os.path.exists(python):
        return {"error": f"{python} does not exist (benchmarks/setup_env.sh makes it; see its install.log)"}
    run = subprocess.run([python, str(Path(__file__).resolve()), f"--{mode}", json.dumps(payload)],
                         capture_output=True, text=True, timeout=timeout, env=child_env())
    lines = run.stdout.strip().splitlines()
    if run.returncode != 0 or not lines:
        tail = [ln for ln in run.stderr.splitlines() if ln.strip()] or ["no output"]
        return {"error": f"exit status {run.returncode}: {tail[-1][:300]}"}
    return json.loads(lines[-1])


def probe(name: str, python: str, timeout: float) -> dict:
    """What the column says in ``python``: why it cannot run there (or None), its versions."""
    if python == sys.executable:
        col = column(name)
        return {"missing": col.missing(), "versions": versions(col.packages)}
    answer = in_interpreter(python, "probe", {"loader": name}, timeout)
    if "error" in answer:
        col = column(name)
        return {"missing": f"{col.packages[0]} cannot run in {python}: {answer['error']}",
                "versions": dict.fromkeys(col.packages, "not installed")}
    return answer


def child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


# ------------------------------------------------------------------ one cell


@dataclasses.dataclass
class Phase:
    """What one child process left: the ids per step up to its last save (all of them
    for a run to the end), whether it saved, its error."""

    ids: list[int]
    saved: bool
    error: str | None
    notes: list[str]
    harness_error: str | None = None


def run_child(request: dict, timeout: float, python: str = sys.executable) -> Phase:
    out = request["out"]
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    env = child_env()
    env["RESUME_MATRIX_PIDS"] = request["pids"]
    env.setdefault("HF_DATASETS_OFFLINE", "1")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env["HF_HOME"] = os.path.join(request["root"], "hf-home")
    env["TOKENIZERS_PARALLELISM"] = "false"
    command = [python, str(Path(__file__).resolve()), "--child", json.dumps(request)]
    with open(os.path.join(out, "stderr.txt"), "w") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr,
                                   start_new_session=True, env=env)
        try:
            process.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        # Whatever is left of its session: workers it leaked, or all of it on a timeout.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    return read_phase(out, request["role"], process.returncode, timeout if timed_out else None)


def read_phase(out: str, role: str, returncode: int, timed_out_after: float | None = None) -> Phase:
    """What a finished child left in ``out`` (see :mod:`resume.child`)."""
    steps: list[list[int]] = []
    last_save = None
    with open(os.path.join(out, "ids.jsonl")) as f:
        for line in f:
            entry = json.loads(line)
            if "saved" in entry:
                last_save = len(steps)
            else:
                steps.append(entry["ids"])
    if role == "first":
        steps = steps[:last_save] if last_save is not None else []
    result: dict = {}
    result_path = os.path.join(out, "result.json")
    if os.path.exists(result_path):
        with open(result_path) as f:
            try:
                result = json.load(f)
            except ValueError:
                result = {"error": "its result file is unreadable (the process died writing it)"}
    error = result.get("error")
    if timed_out_after is not None:
        error = f"timed out after {timed_out_after:.0f} s (a hang)"
    elif error is None and returncode not in (0, -signal.SIGKILL):
        with open(os.path.join(out, "stderr.txt")) as f:
            tail = [ln for ln in f.read().splitlines() if ln.strip()] or ["no output"]
        error = f"exit status {returncode}: {tail[-1][:300]}"
    return Phase([i for s in steps for i in s], last_save is not None, error, result.get("notes", []),
                 result.get("harness_error"))


def judge(scenario: str, order_promised: bool, reference: Phase, first: Phase, second: Phase,
          notes: list[str]) -> dict:
    """The cell, from the reference, the interrupted run (up to its save) and the resume."""
    compare = common.compare(reference.ids, first.ids + second.ids)
    if scenario == "source_changed":
        if second.error is not None:
            return {"ok": True, "lost": 0, "repeated": 0, "order": None, "supported": True,
                    "note": "; ".join([f"noticed: {second.error}", *notes])}
        return {"ok": False, "lost": compare["lost"], "repeated": compare["repeated"], "order": None,
                "supported": True, "note": "; ".join(["the change was not noticed: the resume read on", *notes])}
    if second.error:  # a refusal or a crash: nothing was used silently, the run cannot go on
        return {"ok": False, "lost": 0, "repeated": 0, "order": None,
                "supported": True, "note": "; ".join([f"the resume raised: {second.error}", *notes])}
    order = compare["same_order"] if scenario != "elastic" else None
    ok = compare["lost"] == 0 and compare["repeated"] == 0 and not (order_promised and order is False)
    return {"ok": ok and first.error is None, "lost": compare["lost"], "repeated": compare["repeated"],
            "order": order, "order_promised": order_promised, "supported": True, "note": "; ".join(notes)}


class Matrix:
    def __init__(self, root: str, sizes: common.Sizes, timeout: float, here: bool = False) -> None:
        self.root, self.sizes, self.timeout, self.here = root, sizes, timeout, here
        self._data: dict[tuple[str, str], str] = {}
        self._references: dict[tuple[str, str], Phase] = {}
        self._probes: dict[str, dict] = {}

    def probe(self, name: str, col: Any) -> dict:
        if name not in self._probes:
            self._probes[name] = probe(name, interpreter(col, self.here), self.timeout)
        return self._probes[name]

    def write(self, python: str, fmt: str, directory: str, order: list[int]) -> str:
        """``data.write`` in the interpreter of the column that reads the format."""
        if python == sys.executable:
            return data.write(fmt, directory, order)
        answer = in_interpreter(python, "write-data", {"fmt": fmt, "directory": directory, "order": order},
                                self.timeout)
        if "error" in answer:
            raise RuntimeError(f"writing the {fmt} data in {python} failed: {answer['error']}")
        return answer["path"]

    def data(self, python: str, fmt: str, which: str) -> str:
        key = (fmt, which)
        if key not in self._data:
            n = self.sizes.records if which == "a" else self.sizes.records // 2
            self._data[key] = self.write(python, fmt, os.path.join(self.root, "data", f"{fmt}-{which}"),
                                         list(range(n)))
        return self._data[key]

    def cell(self, name: str, col: Any, scenario: str) -> dict:
        missing = self.probe(name, col)["missing"]
        if missing:
            return {"ok": False, "lost": 0, "repeated": 0, "order": None, "supported": False,
                    "note": f"not installed: {missing}"}
        reason = col.unsupported(scenario)
        if reason:
            what = "not measured here" if reason.startswith("not measured here") else "not supported"
            return {"ok": False, "lost": 0, "repeated": 0, "order": None, "supported": False,
                    "note": f"{what}: {reason.removeprefix('not measured here: ')}"}
        fmt = col.fmt(scenario)
        python = interpreter(col, self.here)
        cell_dir = os.path.join(self.root, "cells", name, scenario)
        shutil.rmtree(cell_dir, ignore_errors=True)
        os.makedirs(os.path.join(cell_dir, "pids"))
        sources = {"a": self.data(python, fmt, "a")}
        if scenario == "mixture":
            sources["b"] = self.data(python, fmt, "b")
        if scenario == "source_changed":  # this cell's own copy, rewritten before the resume
            sources = {"a": self.write(python, fmt, os.path.join(cell_dir, "data"), list(range(self.sizes.records)))}
        base = {"loader": name, "scenario": scenario, "sizes": dataclasses.asdict(self.sizes),
                "data": sources, "workdir": cell_dir, "pids": os.path.join(cell_dir, "pids"),
                "root": self.root, "epochs": 2 if scenario == "epoch_boundary" else 1,
                "hosts": 2 if scenario == "elastic" else 1}
        key = (name, "base" if scenario in BASE else scenario)
        if key not in self._references:
            self._references[key] = run_child({**base, "role": "reference", "out": os.path.join(cell_dir, "reference")},
                                              self.timeout, python)
        reference = self._references[key]
        if reference.error:
            return self._failed("the uninterrupted run failed", reference.error)
        first = run_child({**base, "role": "first", "out": os.path.join(cell_dir, "first")}, self.timeout, python)
        if first.harness_error:
            return {"ok": False, "lost": 0, "repeated": 0, "order": None, "supported": None,
                    "note": f"not measured here: {first.harness_error}"}
        notes = list(first.notes)
        if not first.saved:
            return self._failed("the interrupted run never saved", first.error)
        if first.error:
            notes.append(f"the interrupted run raised after its save: {first.error}")
        resume = {**base, "role": "resume", "out": os.path.join(cell_dir, "resume"),
                  "state": os.path.join(cell_dir, "first", "state.bin")}
        if scenario == "source_changed":
            # A refusal counts as noticing the change only if the same resume on the
            # unchanged files goes through: run it first, in a process of its own.
            control = run_child({**resume, "out": os.path.join(cell_dir, "control")}, self.timeout, python)
            if control.error:
                return {"ok": False, "lost": 0, "repeated": 0, "order": None, "supported": True,
                        "note": f"not measured: the resume raises on the unchanged files too: {control.error}"}
            self.write(python, fmt, os.path.join(cell_dir, "data"), common.order_for_change(self.sizes.records))
        if scenario == "worker_count":
            resume["workers"] = 1
        if scenario == "elastic":
            resume["hosts"] = 3
        second = run_child(resume, self.timeout, python)
        return judge(scenario, col.promises_order(scenario), reference, first, second, notes)

    @staticmethod
    def _failed(what: str, error: str | None) -> dict:
        return {"ok": False, "lost": 0, "repeated": 0, "order": None, "supported": True,
                "note": f"{what}: {error}"}


# ------------------------------------------------------------------ output


def short(cell: dict) -> str:
    if cell["note"].startswith("not measured"):
        return "not measured"
    if not cell.get("supported", True):
        return cell["note"].split(":")[0]  # not installed, not supported, not measured here
    if cell["ok"]:
        return "ok"
    parts = []
    if cell["lost"]:
        parts.append(f"{cell['lost']} lost")
    if cell["repeated"]:
        parts.append(f"{cell['repeated']} repeated")
    if cell.get("order") is False and cell.get("order_promised"):
        parts.append("order differs")
    if cell["note"].startswith("the resume raised"):
        parts.append("the resume raised")
    elif "raised" in cell["note"] or "failed" in cell["note"] or "never saved" in cell["note"]:
        parts.append("the run raised")
    if "not noticed" in cell["note"]:
        parts.insert(0, "not noticed")
    return "NO: " + ", ".join(parts) if parts else "NO"


def markdown(result: dict) -> str:
    names = list(result["loaders"])
    lines = [f"| scenario | {' | '.join(names)} |", f"|---|{'---|' * len(names)}"]
    for sc in result["scenarios"]:
        lines.append(f"| {sc} | {' | '.join(short(result['loaders'][n][sc]) for n in names)} |")
    lines.append("")
    lines.append("Notes (every cell that is not ok, and every refusal):")
    lines.append("")
    for n in names:
        for sc in result["scenarios"]:
            cell = result["loaders"][n][sc]
            if cell["note"] and (not cell["ok"] or sc == "source_changed"):
                lines.append(f"- **{n} / {sc}**: {cell['note']}")
    return "\n".join(lines)


def machine() -> dict:
    load = os.getloadavg()
    return {"python": platform.python_version(), "platform": platform.platform(),
            "cpus": os.cpu_count(), "load_average_start": [round(x, 2) for x in load]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI-sized runs")
    parser.add_argument("--loaders", default=",".join(COLUMNS), help="columns, comma-separated")
    parser.add_argument("--scenarios", default=",".join(common.SCENARIOS), help="rows, comma-separated")
    parser.add_argument("--json", help="write the result here")
    parser.add_argument("--markdown", help="write the table here")
    parser.add_argument("--here", action="store_true",
                        help="run in this interpreter, not benchmarks/.venv (columns not installed here say so)")
    parser.add_argument("--workdir", help="keep the runs' files here (default: a temporary folder)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds one process may take")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--probe", help=argparse.SUPPRESS)
    parser.add_argument("--write-data", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        from resume import child

        request = json.loads(args.child)
        child.run(request, column(request["loader"]))
        return
    if args.probe:  # in a column's own environment: what it says there
        col = column(json.loads(args.probe)["loader"])
        print(json.dumps({"missing": col.missing(), "versions": versions(col.packages)}))
        return
    if args.write_data:  # in a column's own environment: its format's data
        request = json.loads(args.write_data)
        print(json.dumps({"path": data.write(request["fmt"], request["directory"], request["order"])}))
        return
    if not args.here:
        from bench_env import ensure_venv

        ensure_venv(__file__, sys.argv[1:])
    names = [n for n in args.loaders.split(",") if n]
    scenarios = [s for s in args.scenarios.split(",") if s]
    for n in names:
        if n not in COLUMNS:
            parser.error(f"unknown loader {n!r}; choose from {', '.join(COLUMNS)}")
    for s in scenarios:
        if s not in common.SCENARIOS:
            parser.error(f"unknown scenario {s!r}; choose from {', '.join(common.SCENARIOS)}")
    sizes = common.QUICK if args.quick else common.FULL
    root = args.workdir or tempfile.mkdtemp(prefix="resume-matrix-")
    matrix = Matrix(root, sizes, args.timeout, here=args.here)
    started = time.monotonic()
    result: dict = {"scenarios": scenarios, "loaders": collections.OrderedDict(), "versions": {},
                    "machine": machine(), "sizes": dataclasses.asdict(sizes)}
    for n in names:
        col = column(n)
        result["versions"][n] = matrix.probe(n, col)["versions"]
        result["loaders"][n] = {}
        for sc in scenarios:
            t = time.monotonic()
            cell = matrix.cell(n, col, sc)
            cell["seconds"] = round(time.monotonic() - t, 1)
            result["loaders"][n][sc] = cell
            print(f"{n:16s} {sc:16s} {short(cell):28s} {cell['seconds']:6.1f}s  {cell['note'][:150]}", flush=True)
            if args.json:  # as it goes: a run cut short keeps the cells it has
                with open(args.json, "w") as f:
                    json.dump(result, f, indent=1)
    result["seconds"] = round(time.monotonic() - started, 1)
    # CPU of every process the cells ran (those reaped; workers a SIGKILL ended are not):
    # what the matrix costs a quiet machine, whatever else ran beside it.
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    result["child_cpu_seconds"] = round(children.ru_utime + children.ru_stime, 1)
    result["machine"]["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    table = markdown(result)
    print()
    print(table)
    print(f"\n{result['seconds']:.0f} s wall, {result['child_cpu_seconds']:.0f} s CPU in child processes; load average at start {result['machine']['load_average_start']}, "
          f"at end {result['machine']['load_average_end']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table + "\n")
    if not args.workdir:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
