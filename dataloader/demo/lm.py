"""The main job (``make demo``): a language model trained on the standard library's text.

1. Writes Python's own standard library (every machine has it) as ArrayRecord shards of
   text pieces under ``<out_dir>/text``, holding every 20th piece out for eval, and
   trains a byte-level BPE tokenizer on it (``tokenizers``, about a second).
2. Reads ``configs/lm_demo.yaml``, MaxText's data keys and the model's, and builds
   MaxText's pipeline (:mod:`dataloader.maxtext`): tokenize in 2 worker processes,
   first-fit packing into rows, batches in MaxText's layout, the device queue.
3. Trains a small transformer (plain JAX, hand-written Adam) with an asynchronous Orbax
   checkpoint (model, Adam's moments and the loader's position) every
   ``checkpoint_period`` steps, and is "preempted" at ``preempt_at``.
4. Resumes from the latest checkpoint with a new pipeline and manager, trains to
   ``steps``, and checks that the batches after the checkpoint (by fingerprint) and
   the losses are bitwise those of the uninterrupted run.
5. Runs the eval pipeline once over the held-out pieces (every one kept, the last batch
   padded with a mask) and reports the eval loss.

It prints the loss going down, tokens/s, the fill ratio of the packed rows and the share
of the training loop spent waiting for data.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from dataloader.config import checks as check
from dataloader.config.shipped import shipped_config
from dataloader.demo import loop
from dataloader.demo.text import train_tokenizer, write_text_shards
from dataloader.demo.transformer import ModelShape, eval_step, init_state, train_step
from dataloader.device.feed import device_prefetch
from dataloader.maxtext import (
    EvalBatches,
    MaxTextConfig,
    eval_dataset,
    load_maxtext_config,
    train_dataset,
)

_DEFAULTS: dict[str, Any] = {
    "vocab_size": 1024, "base_emb_dim": 64, "base_num_decoder_layers": 2, "base_num_query_heads": 4,
    "base_mlp_dim": 256, "learning_rate": 3e-3, "init_weights_seed": 0, "steps": 300,
    "checkpoint_period": None, "preempt_at": None, "log_period": 50, "text_bytes": 1_500_000,
}


def default_config_path() -> str:
    return shipped_config("lm_demo")


@dataclasses.dataclass(frozen=True)
class LMOptions:
    """The model's and the loop's keys of the demo's config (checked, with defaults)."""

    vocab_size: int
    width: int
    layers: int
    heads: int
    mlp: int
    learning_rate: float
    seed: int
    steps: int
    checkpoint_every: int
    preempt_at: int
    log_every: int
    text_bytes: int

    @classmethod
    def from_config(cls, other: dict[str, Any]) -> LMOptions:
        v = {**_DEFAULTS, **other}
        steps = check.integer("steps", v["steps"], low=2)
        every = steps // 4 if v["checkpoint_period"] is None else v["checkpoint_period"]
        preempt = steps - steps // 8 if v["preempt_at"] is None else v["preempt_at"]
        options = cls(
            vocab_size=check.integer("vocab_size", v["vocab_size"], low=260),
            width=check.integer("base_emb_dim", v["base_emb_dim"], low=8),
            layers=check.integer("base_num_decoder_layers", v["base_num_decoder_layers"], low=1),
            heads=check.integer("base_num_query_heads", v["base_num_query_heads"], low=1),
            mlp=check.integer("base_mlp_dim", v["base_mlp_dim"], low=1),
            learning_rate=check.number("learning_rate", v["learning_rate"], positive=True),
            seed=check.integer("init_weights_seed", v["init_weights_seed"], low=0),
            steps=steps,
            checkpoint_every=check.integer("checkpoint_period", every, low=1),
            preempt_at=check.integer("preempt_at", preempt, low=1),
            log_every=check.integer("log_period", v["log_period"], low=1),
            text_bytes=check.integer("text_bytes", v["text_bytes"], low=10_000),
        )
        if options.width % options.heads:
            raise check.fail("base_num_query_heads", f"must divide base_emb_dim={options.width}, got {options.heads}")
        loop.check_schedule("preempt_at", "checkpoint_period", options.checkpoint_every,
                            options.preempt_at, options.steps)
        return options


def _tokens(batch: Any) -> tuple[int, int]:
    """(real tokens, cells) of a batch: what tokens/s and the fill ratio count."""
    segments = np.asarray(batch["inputs_segmentation"])
    return int(np.count_nonzero(segments)), int(segments.size)


def _evaluate(config: MaxTextConfig, params: Any, shape: ModelShape, batch_size: int) -> dict[str, Any]:
    """One pass over the held-out pieces: every sequence kept, the last batch padded."""
    ds = eval_dataset(config, global_batch_size=batch_size)
    batches = EvalBatches(iter(ds), batch_size=batch_size, length=config.max_target_length)
    total = count = 0.0
    rows = real_rows = n = 0
    for batch in batches:
        loss, weight = eval_step(params, batch, shape)
        total, count = total + float(loss), count + float(weight)
        rows, real_rows, n = rows + len(batch["mask"]), real_rows + int(batch["mask"].sum()), n + 1
    batches.close()
    return {"eval_loss": total / max(count, 1.0), "eval_batches": n, "eval_rows": real_rows,
            "eval_padding_rows": rows - real_rows, "eval_targets": int(count)}


def run_lm_demo(out_dir: str = "demo_out", config_path: str | None = None, overrides: Sequence[str] = (),
                out: Callable[[str], None] = print) -> dict[str, Any]:
    """Runs the whole language-model demo; returns its figures (``resume_ok`` among them).

    Args:
        out_dir: where the text, the tokenizer and the checkpoints go (``text/`` and
            ``lm_checkpoints/`` are emptied first).
        config_path: the config (default: the packaged ``configs/lm_demo.yaml``).
        overrides: ``key=value`` strings, as MaxText takes them.
        out: where progress lines go.
    """
    started = time.perf_counter()
    config_path = config_path or default_config_path()
    text_dir = os.path.join(out_dir, "text")
    overrides = [f"grain_train_files={text_dir}/train-*.array_record",
                 f"grain_eval_files={text_dir}/eval-*.array_record",
                 f"tokenizer_path={text_dir}/tokenizer.json", *overrides]
    # Everything is checked before any file is written.
    config = load_maxtext_config(config_path, overrides, other_keys=_DEFAULTS)
    opts = LMOptions.from_config(dict(config.other))
    for folder in ("text", "lm_checkpoints"):
        shutil.rmtree(os.path.join(out_dir, folder), ignore_errors=True)
    began = time.perf_counter()
    data = write_text_shards(text_dir, max_bytes=opts.text_bytes, min_chars=100, max_chars=1000,
                             num_shards=4, eval_every=20)
    train_tokenizer(data["train_texts"], config.tokenizer_path, opts.vocab_size)
    out(f"[1/5] data: {data['files']} modules of the standard library ({data['bytes'] / 1e6:.1f} MB) as "
        f"{len(data['train_texts'])} training pieces in {len(data['train'])} ArrayRecord shards and "
        f"{data['eval_count']} held out; byte-level BPE of {opts.vocab_size} tokens trained in "
        f"{time.perf_counter() - began:.1f} s")
    batch_size = config.global_batch_size(jax.device_count())
    out(f"[2/5] pipeline {config_path}: tokenize ({config.tokenizer_type}, BOS/EOS) in "
        f"{config.worker_count} workers, {config.packing_type} packing into rows of "
        f"{config.max_target_length}, batches of {batch_size} in MaxText's layout, the device queue")
    shape = ModelShape(opts.vocab_size, config.max_target_length, opts.width, opts.layers, opts.heads, opts.mlp)
    template = init_state(jax.random.key(opts.seed), shape)
    ds = train_dataset(config, global_batch_size=batch_size)
    job = loop.Job(
        base_iterator=lambda: iter(ds), on_device=lambda it: device_prefetch(it, None),
        step=lambda state, batch: train_step(state, batch, shape, opts.learning_rate), count=_tokens,
        checkpoint_every=opts.checkpoint_every, log_every=opts.log_every,
        preempt_at=opts.preempt_at, steps=opts.steps)
    ckpt_dir = os.path.join(out_dir, "lm_checkpoints")
    params_count = sum(x.size for x in jax.tree.leaves(template["params"]))
    out(f"[3/5] training a {opts.layers}-layer transformer ({params_count / 1e3:.0f}k parameters) for steps "
        f"0..{opts.preempt_at}, async Orbax checkpoint every {opts.checkpoint_every} steps into {ckpt_dir}")
    run = loop.preempt_and_resume(job, ckpt_dir, template, out, "[4/5]")
    first, second, wait, loop_s = run.first, run.second, run.wait, run.loop_s
    evaluation = _evaluate(config, run.state["params"], shape, batch_size)
    out(f"[5/5] eval: loss {evaluation['eval_loss']:.4f} over {evaluation['eval_targets']:,} held-out "
        f"targets: {evaluation['eval_rows']} rows in {evaluation['eval_batches']} batches, "
        f"{evaluation['eval_padding_rows']} padding rows masked, nothing dropped")
    tokens = first.items + second.items
    result: dict[str, Any] = {
        **run.figures(),
        "first_loss": first.losses[0],
        "final_loss": second.losses[opts.steps - 1],
        "tokens_per_s": tokens / (first.loop_s + second.loop_s),
        "fill_ratio": tokens / max(first.cells + second.cells, 1),
        "step_ms": 1e3 * loop_s / max(len(first.losses) + len(second.losses) - 2, 1),
        **evaluation,
    }
    out(f"summary: loss {result['first_loss']:.3f} -> {result['final_loss']:.3f} (eval "
        f"{result['eval_loss']:.3f}); {result['tokens_per_s']:,.0f} tokens/s; rows {result['fill_ratio']:.1%} "
        f"full; first batch after {result['first_batch_s'] * 1e3:.0f} ms; waiting for data "
        f"{wait:.1%} of the training loop ({result['step_ms']:.0f} ms per step)")
    run.report_pipeline_time(out)
    return loop.finish(result, started, out)


def main(out_dir: str, config_path: str | None, overrides: Sequence[str]) -> int:
    result = run_lm_demo(out_dir, config_path, overrides, out=lambda line: print(line, flush=True))
    return 0 if result["resume_ok"] and result["losses_identical"] else 1
