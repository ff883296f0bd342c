"""One phase of one cell, in a process of its own: the uninterrupted reference, the
interrupted first run, or the resume.

The parent (``resume_matrix.py``) starts ``resume_matrix.py --child REQUEST`` in a new
session (so a SIGKILL of its process group ends it with its workers, as a preemption
does) and reads back what this writes:

* ``ids.jsonl``: one line per step, ``{"host": h, "ids": [...]}``, and a line
  ``{"saved": n}`` after each save (flushed, so a SIGKILL never loses a written line);
* ``state-N.bin``: the checkpoint (the loader's own bytes: JSON, a pickled
  ``state_dict``, ...), written to a temporary name and renamed, as a checkpoint
  manager does;
* ``result.json``: ``{"error": ...}`` when the loader raised, with its own words.

Steps of the first run: every host takes ``save_step`` steps, then the states are
saved and the process ends (mid-epoch scenarios); sigkill saves every ``save_every``
steps and SIGKILLs its own process group after ``kill_step`` steps; worker_replaced
SIGKILLs a worker (a process that ran the pipeline's functions) right before the save
and takes two more steps after it; epoch_boundary saves one step before the end of the
first epoch; elastic saves after ``save_step // 2`` steps on every host.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pickle
import signal
import traceback
from typing import Any

from resume import common


@dataclasses.dataclass
class Context:
    """What a column needs to open one host's run."""

    scenario: str
    sizes: common.Sizes
    data: dict[str, str]  # "a" (and "b" for the mixture): what the loader is given
    workdir: str  # this cell's folder (caches, scratch)
    workers: int = common.WORKERS
    host: int = 0
    hosts: int = 1
    epochs: int = 1


def _write_atomic(path: str, blob: bytes) -> None:
    with open(path + ".tmp", "wb") as f:
        f.write(blob)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)


def _write_result(out: str, result: dict[str, Any]) -> None:
    """Writes result.json whole or not at all. A loader whose worker died may raise again
    from its SIGCHLD handler in the middle of the write (torch's does): try again."""
    blob = json.dumps(result).encode()
    for attempt in range(5):
        try:
            _write_atomic(os.path.join(out, "result.json"), blob)
            return
        except Exception:
            if attempt == 4:
                raise


def _kill_a_worker(pid_dir: str) -> int | None:
    """SIGKILLs one live process (not this one) that ran the pipeline's functions."""
    for name in sorted(os.listdir(pid_dir)):
        pid = int(name)
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        return pid
    return None


def run(request: dict[str, Any], column: Any) -> None:
    """Runs ``request["role"]`` for ``column`` and writes the files above."""
    out = request["out"]
    os.makedirs(out, exist_ok=True)
    sizes = common.Sizes(**request["sizes"])
    hosts = request.get("hosts", 1)
    ctx = [Context(request["scenario"], sizes, request["data"], request["workdir"], request.get("workers", common.WORKERS),
                   h, hosts, request.get("epochs", 1)) for h in range(hosts)]
    with open(os.path.join(out, "ids.jsonl"), "a", buffering=1) as log:
        _run(request, column, ctx, log)


def _run(request: dict[str, Any], column: Any, ctx: list[Context], log: Any) -> None:
    out, scenario, role = request["out"], request["scenario"], request["role"]
    runs: list[Any] = []
    try:
        if role == "resume":
            with open(request["state"], "rb") as f:
                states = pickle.load(f)  # one blob per old host
            for c in ctx:
                runs.append(column.open(c, states if scenario == "elastic" else states[c.host]))
        else:
            runs = [column.open(c, None) for c in ctx]
        if role == "first":
            _first(request, runs, log)
        else:
            for h, r in enumerate(runs):
                for ids in r:
                    log.write(json.dumps({"host": h, "ids": ids}) + "\n")
    except Exception as error:  # the loader's own words go into the cell's note
        lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
        if len(lines) > 2:  # a worker's error with its traceback: the first and last lines
            lines = [lines[0], "...", lines[-1]]
        detail = f"{type(error).__name__}: {' '.join(lines)}"
        if not str(error):  # an assert with no message: say where it fired
            frame = traceback.extract_tb(error.__traceback__)[-1]
            detail += f"(at {frame.filename.split('site-packages/')[-1]}:{frame.lineno}: {frame.line})"
        _write_result(out, {"error": detail, "traceback": traceback.format_exc()})
    finally:
        for r in runs:
            with contextlib.suppress(Exception):  # a loader that fails to close: its error came first
                r.close()


def _first(request: dict[str, Any], runs: list[Any], log: Any) -> None:
    sizes = common.Sizes(**request["sizes"])
    scenario, out = request["scenario"], request["out"]
    iters = [iter(r) for r in runs]
    if scenario == "epoch_boundary":
        last = sizes.steps_per_epoch - 1
    elif scenario == "sigkill":
        last = sizes.kill_step
    elif scenario == "elastic":  # each host's batch is a share of 6 * (batch // 2) rows
        last = sizes.save_step // 2
    else:
        last = sizes.save_step
    notes = []

    def save(step: int) -> None:
        blobs = [r.save() for r in runs]
        _write_atomic(os.path.join(out, "state.bin"), pickle.dumps(blobs))
        log.write(json.dumps({"saved": step}) + "\n")

    for step in range(1, last + 1):
        for h, it in enumerate(iters):
            log.write(json.dumps({"host": h, "ids": next(it)}) + "\n")
        if scenario == "sigkill":
            if step % sizes.save_every == 0:
                save(step)
            if step == last:
                os.killpg(0, signal.SIGKILL)  # a preemption: this process and its workers
    if scenario == "worker_replaced":
        victim = _kill_a_worker(os.environ["RESUME_MATRIX_PIDS"])
        if victim is None:  # the harness's failure, not the loader's: say so, measure nothing
            _write_result(out, {"harness_error": "no live worker process had run the pipeline's functions"})
            return
        notes.append(f"killed worker pid {victim}")
    save(last)
    if scenario == "worker_replaced":
        # The run goes on after the save: the loader must survive the lost worker.
        for _ in range(2):
            for it in iters:
                next(it)
        notes.append("the run went on after the kill")
    _write_result(out, {"notes": notes})
