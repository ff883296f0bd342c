"""The language-model demo at a tiny size: real text, a trained BPE, 2 workers, packing,
the device queue, Orbax checkpoints, a preemption and a bitwise resume."""

from __future__ import annotations

import os

import pytest

from dataloader.demo.lm import LMOptions, run_lm_demo
from dataloader.demo.text import pieces
from dataloader.errors import ConfigError

TINY = ["steps=12", "checkpoint_period=4", "preempt_at=10", "log_period=4", "text_bytes=60000",
        "vocab_size=300", "base_emb_dim=16", "base_num_decoder_layers=1", "base_num_query_heads=2",
        "base_mlp_dim=32", "max_target_length=32", "per_device_batch_size=4"]


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    lines: list[str] = []
    out_dir = str(tmp_path_factory.mktemp("lm") / "out")
    figures = run_lm_demo(out_dir, overrides=TINY, out=lines.append)
    return figures, lines, out_dir


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_resume_continues_the_batches_and_losses_bitwise(result):
    figures, lines, _ = result
    assert figures["resume_ok"] and figures["losses_identical"] and figures["resumed_from"] == 8
    assert any("the 2 batches after step 8 are identical" in line for line in lines)


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_checkpoints_hold_the_loader_state_beside_the_model(result):
    figures, _, out_dir = result
    assert figures["checkpoints"] == [4, 8]
    assert os.path.exists(os.path.join(out_dir, "lm_checkpoints", "12", "data", "process_0-of-1.json"))
    assert os.path.exists(os.path.join(out_dir, "text", "tokenizer.json"))


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_reports_tokens_fill_loss_and_waiting(result):
    figures, lines, _ = result
    summary = next(line for line in lines if line.startswith("summary:"))
    for part in ("tokens/s", "full", "waiting for data", "->"):
        assert part in summary
    assert figures["tokens_per_s"] > 0 and 0.5 < figures["fill_ratio"] <= 1
    assert 0 <= figures["wait_fraction"] <= 1
    assert figures["final_loss"] < figures["first_loss"]
    # The eval pass keeps every held-out piece: one row per piece at most this long.
    assert figures["eval_rows"] > 0 and figures["eval_targets"] > 0


def test_options_refuse_a_preemption_on_a_checkpoint_step():
    with pytest.raises(ValueError, match=r"preempt_at: must not be a multiple of checkpoint_period=100, got 200"):
        LMOptions.from_config({"checkpoint_period": 100, "preempt_at": 200, "steps": 400})
    with pytest.raises(ValueError, match=r"base_num_query_heads: must divide base_emb_dim=64, got 3"):
        LMOptions.from_config({"base_num_query_heads": 3})


def test_a_bad_key_is_refused_before_anything_is_written(tmp_path):
    out_dir = tmp_path / "out"
    with pytest.raises(ConfigError, match=r"stpes: unknown key; did you mean steps\?"):
        run_lm_demo(str(out_dir), overrides=["stpes=10"], out=lambda line: None)
    assert not out_dir.exists()


def test_text_is_cut_at_blank_lines_within_bounds():
    text = "a" * 30 + "\n\n" + "b" * 5 + "\n\n\n" + "c" * 50 + "\n\n" + "d" * 3
    out = list(pieces(text, min_chars=10, max_chars=40))
    assert out == ["a" * 30, "b" * 5 + "\n\n" + "c" * 33, "c" * 17, "d" * 3]  # 7 + 33 = 40
