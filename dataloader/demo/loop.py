"""The demos' training loop: steps with timing, asynchronous Orbax checkpoints, a
preemption, and a resume whose batches and losses are compared with the first run's.

Both demos (the language model and the digits) train through :func:`preempted_run`
then :func:`resumed_run` and check the overlap with :func:`compare`: the steps between
the last checkpoint and the preemption were trained twice, once before it and once
after the restore, from the same loader position and model state.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from typing import Any

import jax
import orbax.checkpoint as ocp

from dataloader.checkpoint import CheckpointRestore, CheckpointSave
from dataloader.config import checks as check
from dataloader.demo.model import fingerprint
from dataloader.engine.stats import sorted_stages


def check_schedule(preempt_key: str, every_key: str, every: int, preempt_at: int, steps: int) -> None:
    """Refuses a schedule whose resume would have nothing to compare.

    Args:
        preempt_key, every_key: the config's names of ``preempt_at`` and of the
            checkpoint period, for the messages.
        every, preempt_at, steps: the checkpoint period, the preemption step, the steps.

    Raises:
        ConfigError: not ``every < preempt_at <= steps``, or ``preempt_at`` a multiple of
            ``every``.
    """
    if not every < preempt_at <= steps:
        raise check.fail(preempt_key, f"expected {every_key} < preempt_at <= steps, got "
                         f"{every} < {preempt_at} <= {steps}")
    if preempt_at % every == 0:
        # A checkpoint at preempt_at itself would leave no batches between the
        # restored step and the preemption to compare.
        raise check.fail(preempt_key, f"must not be a multiple of {every_key}={every}, got "
                         f"{preempt_at}; the resume would have no batches to compare")


@dataclasses.dataclass(frozen=True)
class Job:
    """What a demo trains: how to build its iterators and how to take a step.

    Attributes:
        base_iterator: a new loader iterator (it has ``stats()``), at the start.
        on_device: the iterator behind the device queue (or itself).
        step: ``(state, batch) -> (state, loss)``, jitted.
        count: ``batch -> (items, cells)``: what tokens/s or records/s counts, and the
            cells those items could have filled (the fill ratio).
        checkpoint_every, log_every, preempt_at, steps: the schedule.
    """

    base_iterator: Callable[[], Any]
    on_device: Callable[[Any], Any]
    step: Callable[[Any, Any], tuple[Any, Any]]
    count: Callable[[Any], tuple[int, int]]
    checkpoint_every: int
    log_every: int
    preempt_at: int
    steps: int


@dataclasses.dataclass
class Run:
    """What one stretch of training saw, step by step."""

    fingerprints: dict[int, str] = dataclasses.field(default_factory=dict)
    losses: dict[int, float] = dataclasses.field(default_factory=dict)
    wait_s: float = 0.0  # blocked in next(), first batch excluded
    first_batch_s: float = 0.0  # from making the iterator to the first batch
    first_wait_s: float = 0.0  # of which blocked in the first next()
    loop_s: float = 0.0
    items: int = 0
    cells: int = 0


def _train(job: Job, it: Any, state: Any, first: int, stop: int, mngr: ocp.CheckpointManager,
           out: Callable[[str], None], created: float) -> tuple[Any, Run]:
    """Trains steps ``[first, stop)``; ``created`` is when the iterator was made.

    Each step waits for its loss, so the time spent in ``next()`` is time the step
    waited for data, not time the host ran ahead of the device.
    """
    run, began = Run(), time.perf_counter()
    for step in range(first, stop):
        t = time.perf_counter()
        batch = next(it)
        waited = time.perf_counter() - t
        if step == first:
            run.first_batch_s = time.perf_counter() - created
            run.first_wait_s = waited
        else:
            run.wait_s += waited
        run.fingerprints[step] = fingerprint(batch)
        items, cells = job.count(batch)
        run.items += items
        run.cells += cells
        state, loss = job.step(state, batch)
        run.losses[step] = float(loss)
        done = step + 1
        if done % job.checkpoint_every == 0:
            mngr.save(done, args=ocp.args.Composite(params=ocp.args.StandardSave(state),
                                                    data=CheckpointSave(it)))
        if done % job.log_every == 0:
            out(f"  step {done:4d}  loss {run.losses[step]:.4f}")
    jax.block_until_ready(state)
    run.loop_s = time.perf_counter() - began
    return state, run


def manager(directory: str) -> ocp.CheckpointManager:
    options = ocp.CheckpointManagerOptions(max_to_keep=3, enable_async_checkpointing=True)
    return ocp.CheckpointManager(os.path.abspath(directory), options=options)


def where_time_went(stats: dict[str, Any]) -> str:
    return ", ".join(f"{name} {secs:.2f} s" for name, secs in sorted_stages(stats))


def preempted_run(job: Job, ckpt_dir: str, template: Any, out: Callable[[str], None]
                  ) -> tuple[Run, list[int], dict[str, Any]]:
    """Trains to ``preempt_at`` with checkpoints, then drops iterator, model and manager."""
    created = time.perf_counter()
    base = job.base_iterator()
    it = job.on_device(base)
    with manager(ckpt_dir) as mngr:
        _, run = _train(job, it, template, 0, job.preempt_at, mngr, out, created)
        mngr.wait_until_finished()
        saved = list(mngr.all_steps())
    stats = base.stats()
    it.close()
    out(f"  checkpoints at steps {saved}; preempted at step {job.preempt_at}: iterator, model "
        f"and checkpoint manager dropped")
    return run, saved, stats


def resumed_run(job: Job, ckpt_dir: str, template: Any, out: Callable[[str], None], label: str
                ) -> tuple[Any, Run, int, dict[str, Any]]:
    """A new loader and manager restore the latest checkpoint and train to ``steps``."""
    base = job.base_iterator()
    with manager(ckpt_dir) as mngr:
        step = mngr.latest_step()
        restored = mngr.restore(step, args=ocp.args.Composite(
            params=ocp.args.StandardRestore(template), data=CheckpointRestore(base)))
        out(f"{label} resumed from step {step} (model + loader state "
            f"{os.path.join(ckpt_dir, str(step), 'data', 'process_0-of-1.json')})")
        created = time.perf_counter()
        it = job.on_device(base)
        state, run = _train(job, it, restored.params, step, job.steps, mngr, out, created)
        mngr.wait_until_finished()
    stats = base.stats()
    it.close()
    return state, run, step, stats


def compare(first: Run, second: Run, step: int, preempt_at: int, out: Callable[[str], None]) -> tuple[bool, float]:
    """Checks the steps trained twice; returns (same batches, largest loss difference)."""
    overlap = range(step, preempt_at)
    same = all(first.fingerprints[s] == second.fingerprints[s] for s in overlap)
    gap = max(abs(first.losses[s] - second.losses[s]) for s in overlap)
    out(f"  resume check: the {len(overlap)} batches after step {step} are "
        f"{'identical' if same else 'DIFFERENT'} to those of the uninterrupted run "
        f"(fingerprints {first.fingerprints[step]}... = {second.fingerprints[step]}...); losses "
        + ("identical" if gap == 0 else f"differ by up to {gap:.2g} (device arithmetic)"))
    return same, gap


@dataclasses.dataclass(frozen=True)
class Outcome:
    """Both stretches of training and the comparison of the steps trained twice."""

    first: Run
    second: Run
    state: Any  # the model's state after the resumed run
    resumed_from: int
    checkpoints: list[int]
    stats_first: dict[str, Any]
    stats_second: dict[str, Any]
    same_batches: bool
    loss_gap: float
    wait: float  # share of the loop blocked on data
    loop_s: float

    def figures(self) -> dict[str, Any]:
        """The figures both demos report about the resume and the waiting."""
        return {
            "resume_ok": self.same_batches,
            "losses_identical": self.loss_gap == 0,
            "first_batch_s": self.first.first_batch_s,
            "wait_fraction": self.wait,
            "checkpoints": self.checkpoints,
            "resumed_from": self.resumed_from,
        }

    def report_pipeline_time(self, out: Callable[[str], None]) -> None:
        out(f"  pipeline time (all processes): {where_time_went(self.stats_first)} before the "
            f"preemption; {where_time_went(self.stats_second)} after")


def preempt_and_resume(job: Job, ckpt_dir: str, template: Any, out: Callable[[str], None],
                       label: str) -> Outcome:
    """:func:`preempted_run`, :func:`resumed_run` (its first line labelled ``label``),
    then :func:`compare`."""
    first, saved, stats_first = preempted_run(job, ckpt_dir, template, out)
    state, second, step, stats_second = resumed_run(job, ckpt_dir, template, out, label)
    same_batches, loss_gap = compare(first, second, step, job.preempt_at, out)
    wait, loop_s = wait_share(first, second)
    return Outcome(first, second, state, step, saved, stats_first, stats_second, same_batches,
                   loss_gap, wait, loop_s)


def finish(result: dict[str, Any], started: float, out: Callable[[str], None]) -> dict[str, Any]:
    """Adds the demo's ``seconds`` since ``started`` to ``result`` and says it is done."""
    result["seconds"] = time.perf_counter() - started
    out(f"  done in {result['seconds']:.1f} s; resume {'OK' if result['resume_ok'] else 'FAILED'}")
    return result


def wait_share(first: Run, second: Run) -> tuple[float, float]:
    """(share of the loop blocked on data, loop seconds) over both runs, first batches excluded."""
    loop_s = first.loop_s + second.loop_s - first.first_wait_s - second.first_wait_s
    return ((first.wait_s + second.wait_s) / loop_s if loop_s > 0 else 0.0), loop_s
