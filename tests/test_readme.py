"""Every code block of the README runs as written, and prints what it says it prints.

* ``python`` blocks run as scripts, each in a fresh process, in a folder holding the data
  the README says how to make (the first example's ArrayRecord files, the files of the
  mixture example, the language-model example's text and tokenizer, the data
  ``make demo`` writes and a copy of ``configs/``). A line
  ``print(...)  # text`` must print exactly ``text``.
* ``bash`` blocks run line by line in such a folder; ``make`` lines are checked with
  ``make -n`` (the target exists and expands), since running them would recurse.
* ``yaml`` blocks that describe a pipeline are checked as configs.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys

import pytest
import yaml

import dataloader as dl
from dataloader.config import parse_config
from dataloader.demo.data import synthetic_digits, write_digits
from tests.helpers import REPO_ROOT
from tests.tokenizer_files import corpus, huggingface_json

README = pathlib.Path(REPO_ROOT) / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def blocks(language: str) -> list[str]:
    return [body for lang, body in FENCE.findall(README.read_text()) if lang == language]


def expected_prints(block: str) -> list[str]:
    return [line.split("#", 1)[1].strip() for line in block.splitlines()
            if line.startswith("print(") and "#" in line]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prepare(folder: pathlib.Path) -> dict[str, str]:
    """Writes what the README's examples read; returns the environment to run them in."""
    data = folder / "data"
    data.mkdir()
    import numpy as np

    for shard in range(2):  # what the first example writes
        dl.write_array_record(data / f"train-{shard:05d}-of-00002.array_record",
                              [np.full(8, i, np.uint16).tobytes() for i in range(shard * 500, shard * 500 + 500)])
    for name in ("a", "b"):  # the mixture example's spec files
        for shard in range(2):
            dl.write_array_record(data / f"{name}-{shard}.array_record", [b"r%d" % i for i in range(4)])
    # what the language-model section's first example writes: text records and a tokenizer
    dl.write_array_record(data / "text-00000-of-00001.array_record", [t.encode() for t in corpus(300)])
    huggingface_json(str(data))
    images, labels = synthetic_digits(400)  # what make demo writes
    write_digits(folder / "demo_out" / "data", images, labels, test_size=40)
    shutil.copytree(pathlib.Path(REPO_ROOT) / "configs", folder / "configs")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["COORDINATOR"] = f"127.0.0.1:{_free_port()}"
    return env


def test_the_readme_has_examples_of_every_kind():
    assert len(blocks("python")) >= 8
    assert blocks("bash") and blocks("yaml")
    unlabelled = [body for lang, body in FENCE.findall(README.read_text()) if not lang]
    assert not unlabelled, f"give every code block a language: {unlabelled[0][:80]!r}"


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(300)
@pytest.mark.parametrize("number", range(len(blocks("python"))))
def test_python_example_runs_as_written(number, tmp_path):
    block = blocks("python")[number]
    env = prepare(tmp_path)
    script = tmp_path / f"readme_example_{number}.py"
    script.write_text(block)
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, f"example {number} failed:\n{block}\n{out.stderr[-3000:]}"
    assert out.stdout.splitlines() == expected_prints(block)


def _commands(block: str) -> list[str]:
    lines = [re.sub(r"\s+#.*$", "", line).strip() for line in block.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(600)
@pytest.mark.parametrize("number", range(len(blocks("bash"))))
def test_command_block_runs_as_written(number, tmp_path):
    env = prepare(tmp_path)
    for command in _commands(blocks("bash")[number]):
        if command.startswith("make "):
            out = subprocess.run(["make", "-n", *command.split()[1:]], cwd=REPO_ROOT,
                                 capture_output=True, text=True)
        else:
            out = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env,
                                 capture_output=True, text=True, timeout=500)
        assert out.returncode == 0, f"{command!r} failed:\n{out.stderr[-3000:]}"


@pytest.mark.parametrize("number", range(len(blocks("yaml"))))
def test_yaml_config_blocks_are_valid_configs(number):
    data = yaml.safe_load(blocks("yaml")[number])
    if isinstance(data, dict) and "source" in data:
        parse_config(data, check_files=False)
