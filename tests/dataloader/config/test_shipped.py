"""The configs shipped with granary are found through the package, whatever the working
directory: by ``dl.shipped_config(name)``, and by name in ``load_config``,
``load_maxtext_config`` and ``python -m dataloader run``."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import dataloader as dl
from dataloader.cli import run as run_cli
from tests.helpers import REPO_ROOT

CONFIGS = pathlib.Path(REPO_ROOT) / "configs"


@pytest.fixture
def empty_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def write_digits(folder: pathlib.Path, count: int = 200) -> None:
    """Records in the demo's format (a label byte, then 64 pixels of 0..16), where the
    shipped image configs read them: demo_out/data/digits-train-*.array_record."""
    rng = np.random.default_rng(0)
    records = [bytes([i % 10]) + rng.integers(0, 17, 64, dtype=np.uint8).tobytes() for i in range(count)]
    dl.write_array_record(folder / "demo_out" / "data" / "digits-train-00000-of-00001.array_record", records)


def test_every_yaml_file_of_configs_is_shipped_by_its_name():
    names = sorted(p.stem for p in CONFIGS.glob("*.yaml"))
    assert dl.shipped_configs() == names
    for name in names:
        path = dl.shipped_config(name)
        assert pathlib.Path(path).read_text() == (CONFIGS / f"{name}.yaml").read_text()
        assert dl.shipped_config(f"{name}.yaml") == path


def test_an_unknown_name_lists_the_shipped_configs():
    with pytest.raises(dl.ConfigError, match=r"no config named 'demos' is shipped with granary; "
                                             r"the shipped configs are array_record_images, demo, "):
        dl.shipped_config("demos")
    with pytest.raises(dl.ConfigError, match=r"must be a non-empty string, got None"):
        dl.shipped_config(None)


def test_load_config_reads_a_shipped_config_by_name_in_an_empty_folder(empty_folder):
    config = dl.load_config("array_record_images", ["sampler.seed=3"], check_files=False)
    assert config.sampler.seed == 3
    assert config.source.paths == ("demo_out/data/digits-train-*.array_record",)


def test_a_file_of_that_name_in_the_working_directory_wins(empty_folder):
    (empty_folder / "demo").write_text("source: {kind: array_record, paths: mine.array_record}\n")
    assert dl.load_config("demo", check_files=False).source.paths == ("mine.array_record",)


def test_a_missing_path_to_a_shipped_name_says_how_to_read_it(empty_folder):
    with pytest.raises(dl.ConfigError, match=r"config file 'configs/demo.yaml' does not exist; granary "
                                             r"ships a config named 'demo': pass 'demo'"):
        dl.load_config("configs/demo.yaml")
    with pytest.raises(dl.ConfigError, match=r"config file 'nothing.yaml' does not exist$"):
        dl.load_config("nothing.yaml")


def test_load_maxtext_config_reads_a_shipped_config_by_name(empty_folder):
    config = dl.maxtext.load_maxtext_config("maxtext", ["max_target_length=512"])
    assert config.max_target_length == 512


def test_run_takes_the_name_of_a_shipped_config(empty_folder):
    write_digits(empty_folder)
    text = run_cli.run_command(["array_record_images", "loader.worker_count=0", "sampler.num_epochs=1"])
    assert "records read   200 " in text, text


@pytest.mark.multiprocess
def test_python_m_dataloader_run_finds_the_shipped_config_from_any_folder(empty_folder):
    write_digits(empty_folder)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-m", "dataloader", "run", "array_record_images",
                          "loader.worker_count=0", "--max_batches=1"],
                         cwd=empty_folder, env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "batches out    1 " in out.stdout, out.stdout
