"""``python -m dataloader run CONFIG``: iterate a pipeline, then say where the time went.

While it runs, a progress bar on stderr shows the batches, the records read per second
and the slowest stage of the last seconds. At the end it prints the counts (records
read, elements out, batches out: three different things once a filter, a flat map or
a packer is in the pipeline), the time to the first batch, how long the consumer
waited, each worker's busy share, the seconds of each stage, and advice
(:mod:`dataloader.engine.stats.advice`). With ``--report=DIR`` it also writes
``DIR/stats.json`` and ``DIR/report.html`` (:mod:`dataloader.cli.report`).

Without a training step the loop only waits, so its waiting share says nothing about
a real job: ``--step_ms=N`` sleeps N ms after each batch, as a step on an accelerator
would leave the host, and only then is the "step starved" advice given.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from typing import Any

from absl import app

from dataloader.cli.record import Recorder
from dataloader.engine.stats import Advice, advise, sorted_stages, summary_line
from dataloader.engine.stats.progress import Progress
from dataloader.engine.stats.shape import MAIN
from dataloader.engine.stats.text import computed_by
from dataloader.samplers.sharding import shard_length


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
    return any(step.op.reshapes for step in (*plan.pre, *plan.post))


def _expected_batches(loader: Any, limit: int | None) -> int | None:
    """How many outputs the run will see, when that is known in advance."""
    positions, batch = loader.sampler.num_positions, loader.plan.batch
    if positions is None or _output_count_unknown(loader.plan) or loader.stage_operations:  # unknown until run
        return limit
    total = positions
    if batch is not None:
        total = batch.batches_in(positions)
    return total if limit is None else min(total, limit)


def _workers_line(stats: dict[str, Any]) -> str:
    workers = stats["workers"]
    parts = [
        f"{key}: busy {entry['busy_share']:.0%} ({entry['units']:,} units)"
        for key, entry in sorted(workers.items(), key=lambda kv: (kv[0] == MAIN, kv[0]))
    ]
    return "; ".join(parts) if parts else "none"


def run_advice(stats: dict[str, Any], step_ms: float | None) -> list[Advice]:
    """The advice for a run: without a simulated step, none about the step's waiting."""
    return [a for a in advise(stats) if step_ms or a.rule != "step_starved"]


def summary(
    stats: dict[str, Any], first_batch_s: float | None, elapsed: float,
    advice: list[Advice], step_ms: float | None = None,
) -> str:
    """What ``run`` prints at the end (see the module docstring)."""
    device = "device_feed" in stats["pipeline"]
    what, count, note = computed_by(stats["pipeline"])
    if what != "worker processes":  # a pool's count alone, as before; Ray's named
        count = f"{count} {what}" + (f" ({note})" if note else "")
    who = "the training step, in the device feed's" if device else "this process, in the loader's"
    waited = f"{stats['wait_s']:.2f} s: {stats['wait_share']:.0%} of the time, {who} next()"
    waited += f" (a step of {step_ms:g} ms after each batch)" if step_ms else " (no step: see --step_ms)"
    lines = [
        f"records read   {stats['records_read']:,} ({stats['records_per_s']:,.0f}/s)",
        f"elements out   {stats['elements_out']:,} ({stats['elements_per_s']:,.0f}/s)",
        f"batches out    {stats['batches_out']:,} ({stats['batches_per_s']:,.1f}/s) in {elapsed:.2f} s",
        f"first batch    {first_batch_s:.3f} s" if first_batch_s is not None else "first batch    none",
        f"waiting        {waited}",
        f"workers        {count}: " + _workers_line(stats),
    ]
    if stats["pipe_units"]:
        lines.append(f"transport      {stats['pipe_units']:,} of {stats['units']:,} results came "
                     f"through pipes, not shared memory")
    stages = sorted_stages(stats)
    work = sum(secs for _, secs in stages) or 1.0
    width = max((len(name) for name, _ in stages), default=4)
    lines.append("where the time went (seconds, added up over the processes that spent them):")
    lines += [f"  {name:<{width}}  {secs:8.3f} s  {secs / work:6.1%}" for name, secs in stages]
    lines.append("advice:" if advice else "advice:        none (no rule found a cause to name)")
    lines += [f"  - {item}" for item in advice]
    return "\n".join(lines)


def run_command(
    args: Sequence[str], max_batches: int | None = None, report_dir: str | None = None,
    step_ms: float | None = None,
) -> str:
    """``run CONFIG [overrides]``: iterates the pipeline; returns what to print.

    Args:
        args: the config (a YAML file, or a shipped config's name), then ``key.sub=value``
            overrides.
        max_batches: stop after this many batches (default: see :func:`_default_limit`).
        report_dir: also write ``stats.json`` and ``report.html`` there.
        step_ms: sleep this long after each batch, like a training step.
    """
    from dataloader.config.pipeline import load_config

    if not args:
        raise app.UsageError("run needs a config: python -m dataloader run CONFIG [key.sub=value ...]")
    config = load_config(args[0], args[1:])
    if report_dir is not None:
        from dataloader.cli.report import check_report_dir

        check_report_dir(report_dir)  # before the run: matplotlib missing fails now
    if config.device.enabled:
        import dataloader.device.feed  # noqa: F401  JAX's import is not the first batch's time
    began = time.monotonic()
    loader = config.build_loader()
    limit, why = (max_batches, f"--max_batches={max_batches}") if max_batches else _default_limit(loader)
    it = config.on_device(loader.iterator())
    recorder = Recorder(it) if report_dir is not None else None
    first_batch_s = None
    try:
        detail = _Detail(it)
        with Progress(f"run {args[0]}", total=_expected_batches(loader, limit), unit="batches",
                      detail=detail) as bar:
            for _ in itertools.islice(it, limit):
                if first_batch_s is None:
                    first_batch_s = time.monotonic() - began
                if step_ms:
                    time.sleep(step_ms / 1e3)
                bar.update()
                if recorder is not None:
                    recorder.tick()
        elapsed = time.monotonic() - began
        stats = it.stats()
        if recorder is not None:
            recorder.finish()
    finally:
        it.close()
    header = f"ran {why} of {args[0]}" + (f" with {' '.join(args[1:])}" if args[1:] else "")
    advice = run_advice(stats, step_ms)
    text = header + "\n" + summary(stats, first_batch_s, elapsed, advice, step_ms)
    if report_dir is not None and recorder is not None:
        from dataloader.cli.report import write_report

        paths = write_report(report_dir, stats, recorder, advice, title=header,
                             first_batch_s=first_batch_s)
        text += "\nreport         " + "  ".join(paths)
    return text


class _Detail:
    """The progress bar's live part: records/s and the slowest stage of the last seconds
    (``stats()`` at most once a second)."""

    def __init__(self, it: Any) -> None:
        self._it, self._at, self._text = it, 0.0, ""

    def __call__(self) -> str:
        now = time.monotonic()
        if now - self._at >= 1.0:
            self._at, self._text = now, summary_line(self._it.stats())
        return self._text
