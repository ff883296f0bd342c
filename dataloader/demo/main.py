"""The main job (``make demo``): real data to ArrayRecord, a JAX model trained from a
config, Orbax checkpoints, and a resume that continues the very same batch sequence.

1. Writes scikit-learn's digits (shipped with the package, no download) as ArrayRecord
   shards and a Parquet copy under ``<out_dir>/data``.
2. Loads ``configs/demo.yaml``: decode, a random shift, batches of 64, worker
   processes, the device queue.
3. Trains an MLP with plain ``jax.grad`` SGD, saving parameters and the loader's
   position with an asynchronous Orbax ``CheckpointManager`` every
   ``train.checkpoint_every`` steps, then is "preempted" at ``train.preempt_at``: the
   iterator, the model and the manager are dropped.
4. Resumes from the latest checkpoint with a new loader, iterator and manager, trains
   to ``train.steps``, and checks that the batches after the checkpoint (by
   fingerprint) and the losses equal those the uninterrupted run had seen.

It prints the loss, records/s, the time to the first batch, the fraction of the
training loop spent waiting for data, and where the pipeline's time went.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from dataloader.config import checks as check
from dataloader.config.pipeline import PipelineConfig, load_config
from dataloader.config.shipped import shipped_config
from dataloader.demo import loop
from dataloader.demo.data import load_digits, write_digits
from dataloader.demo.model import accuracy, init_params, train_step
from dataloader.engine.pool.autoscale import usable_cpus

# checkpoint_every and preempt_at default to steps // 4 and steps - steps // 8, so that
# overriding steps alone (train.steps=200) gives a consistent run.
_TRAIN_DEFAULTS = {"steps": 400, "checkpoint_every": None, "preempt_at": None, "learning_rate": 0.5,
                   "hidden": 256, "log_every": 50, "seed": 0}


def default_config_path() -> str:
    return shipped_config("demo")


@dataclasses.dataclass(frozen=True)
class TrainOptions:
    """The ``train:`` section of the demo's config (checked, with defaults)."""

    steps: int
    checkpoint_every: int
    preempt_at: int
    learning_rate: float
    hidden: int
    log_every: int
    seed: int

    @classmethod
    def from_config(cls, section: dict[str, Any]) -> TrainOptions:
        check.known_keys("train", section, _TRAIN_DEFAULTS)
        values = {**_TRAIN_DEFAULTS, **section}
        steps = check.integer("train.steps", values["steps"], low=1)
        if values["checkpoint_every"] is None:
            values["checkpoint_every"] = max(1, steps // 4)
        if values["preempt_at"] is None:
            values["preempt_at"] = steps - steps // 8
        options = cls(
            steps=check.integer("train.steps", values["steps"], low=1),
            checkpoint_every=check.integer("train.checkpoint_every", values["checkpoint_every"], low=1),
            preempt_at=check.integer("train.preempt_at", values["preempt_at"], low=1),
            learning_rate=check.number("train.learning_rate", values["learning_rate"], positive=True),
            hidden=check.integer("train.hidden", values["hidden"], low=1),
            log_every=check.integer("train.log_every", values["log_every"], low=1),
            seed=check.integer("train.seed", values["seed"], low=0),
        )
        loop.check_schedule("train.preempt_at", "checkpoint_every", options.checkpoint_every,
                            options.preempt_at, options.steps)
        return options


def run_demo(out_dir: str = "demo_out", config_path: str | None = None, overrides: Sequence[str] = (),
             images: np.ndarray | None = None, labels: np.ndarray | None = None,
             out: Callable[[str], None] = print) -> dict[str, Any]:
    """Runs the whole demo; returns its figures (``resume_ok`` among them).

    Args:
        out_dir: where data and checkpoints go (its data/ and checkpoints/ emptied first).
        config_path: the pipeline config (default: the packaged ``configs/demo.yaml``).
        overrides: ``key.sub=value`` strings applied to the config.
        images, labels: the data set (default: scikit-learn's digits).
        out: where progress lines go.
    """
    started = time.perf_counter()
    config_path = config_path or default_config_path()
    if images is None or labels is None:
        images, labels = load_digits()
    shard_glob = os.path.join(out_dir, "data", "digits-train-*.array_record")
    overrides = [f"source.paths={shard_glob}", *overrides]
    # Everything is checked before any data is written (the files come next).
    opts = TrainOptions.from_config(load_config(config_path, overrides, check_files=False).train)
    for folder in ("data", "checkpoints"):  # the language model's files stay
        shutil.rmtree(os.path.join(out_dir, folder), ignore_errors=True)
    data = write_digits(os.path.join(out_dir, "data"), images, labels)
    out(f"[1/4] data: {data['num_train']} training images in {len(data['train'])} ArrayRecord shards "
        f"(group size 1) and {data['parquet']}; {len(images) - data['num_train']} held out for testing")
    config: PipelineConfig = load_config(config_path, overrides)
    out(f"[2/4] pipeline {config_path}: {', '.join(op.name for op in config.operations)}; "
        f"shuffle seed {config.sampler.seed}; {config.loader.worker_count} workers; device queue "
        f"{'on' if config.device.enabled else 'off'}")
    ckpt_dir = os.path.join(out_dir, "checkpoints")
    template = init_params(jax.random.key(opts.seed), opts.hidden)
    job = loop.Job(
        base_iterator=lambda: config.build_loader().iterator(), on_device=config.on_device,
        step=lambda params, batch: train_step(params, batch, opts.learning_rate),
        count=lambda batch: (len(batch["label"]), len(batch["label"])),
        checkpoint_every=opts.checkpoint_every, log_every=opts.log_every,
        preempt_at=opts.preempt_at, steps=opts.steps)
    out(f"[3/4] training steps 0..{opts.preempt_at}, async Orbax checkpoint every "
        f"{opts.checkpoint_every} steps into {ckpt_dir}")
    run = loop.preempt_and_resume(job, ckpt_dir, template, out, "[4/4]")
    first, second, wait, loop_s = run.first, run.second, run.wait, run.loop_s
    test = np.load(data["test"])
    result: dict[str, Any] = {
        **run.figures(),
        "final_loss": float(second.losses[opts.steps - 1]),
        "test_accuracy": accuracy(run.state, test["images"], test["labels"]),
        "records_per_s": (first.items + second.items) / (first.loop_s + second.loop_s),
    }
    out(f"summary: final loss {result['final_loss']:.4f}, test accuracy {result['test_accuracy']:.1%}; "
        f"{result['records_per_s']:,.0f} records/s; first batch after {result['first_batch_s'] * 1e3:.0f} ms; "
        f"waiting for data {wait:.1%} of the training loop")
    run.report_pipeline_time(out)
    if wait > 0.2:
        step_ms = 1e3 * (loop_s - first.wait_s - second.wait_s) / (len(first.losses) + len(second.losses))
        batch_ms = 1e3 * sum(run.stats_first["stage_seconds"].values()) / max(run.stats_first["units"], 1)
        out(f"  why: the loop spends ~{step_ms:.1f} ms per step outside next() (training step, "
            f"fingerprint, checkpoints), a batch costs the pipeline ~{batch_ms:.1f} ms of CPU, and "
            f"{config.loader.worker_count} workers share {usable_cpus()} cores with the training "
            f"process: with spare cores (loader.worker_count) the workers keep ahead")
    return loop.finish(result, started, out)


def main(out_dir: str, config_path: str | None, overrides: Sequence[str]) -> int:
    result = run_demo(out_dir, config_path, overrides, out=lambda line: print(line, flush=True))
    return 0 if result["resume_ok"] else 1


if __name__ == "__main__":  # pragma: no cover - use `python -m dataloader demo`
    sys.exit(main("demo_out", None, sys.argv[1:]))
