"""The demo's pieces at a tiny size: data, config, training, checkpoints, resume."""

from __future__ import annotations

import os

import pytest

from dataloader.demo.data import synthetic_digits
from dataloader.demo.main import TrainOptions, run_demo
from dataloader.errors import ConfigError

TINY = ["train.steps=12", "train.checkpoint_every=4", "train.preempt_at=10", "train.log_every=4",
        "train.hidden=8", "loader.worker_count=0", "operations.2.batch.batch_size=8"]


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    images, labels = synthetic_digits(340)
    lines: list[str] = []
    out_dir = str(tmp_path_factory.mktemp("demo") / "out")
    figures = run_demo(out_dir, overrides=TINY, images=images, labels=labels, out=lines.append)
    return figures, lines, out_dir


def test_resume_continues_the_batches_and_losses_of_the_uninterrupted_run(result):
    figures, lines, _ = result
    assert figures["resume_ok"] and figures["losses_identical"] and figures["resumed_from"] == 8
    assert any("the 2 batches after step 8 are identical" in line for line in lines)


def test_demo_checkpoints_with_one_state_file_per_process(result):
    figures, _, out_dir = result
    assert figures["checkpoints"] == [4, 8]
    assert os.path.exists(os.path.join(out_dir, "checkpoints", "12", "data", "process_0-of-1.json"))


def test_demo_reports_loss_throughput_and_waiting(result):
    figures, lines, _ = result
    summary = next(line for line in lines if line.startswith("summary:"))
    for part in ("final loss", "records/s", "waiting for data"):
        assert part in summary
    assert figures["records_per_s"] > 0 and 0 <= figures["wait_fraction"] <= 1


def test_train_options_refuse_a_preemption_on_a_checkpoint_step():
    with pytest.raises(ValueError, match=r"train\.preempt_at: must not be a multiple of checkpoint_every=100, got 200"):
        TrainOptions.from_config({"checkpoint_every": 100, "preempt_at": 200, "steps": 400})


def test_train_options_refuse_a_preemption_before_the_first_checkpoint():
    with pytest.raises(ValueError, match=r"train\.preempt_at: expected checkpoint_every < preempt_at <= steps"):
        TrainOptions.from_config({"checkpoint_every": 100, "preempt_at": 50})


def test_overriding_the_steps_alone_gives_a_consistent_run():
    options = TrainOptions.from_config({"steps": 200})
    assert (options.checkpoint_every, options.preempt_at) == (50, 175)


def test_a_bad_override_is_refused_before_any_data_is_written(tmp_path):
    images, labels = synthetic_digits(40)
    out_dir = tmp_path / "out"
    with pytest.raises(ConfigError, match=r"train\.preempt_at: expected checkpoint_every < preempt_at <= steps"):
        run_demo(str(out_dir), overrides=["train.preempt_at=1000"], images=images, labels=labels,
                 out=lambda line: None)
    assert not out_dir.exists()
