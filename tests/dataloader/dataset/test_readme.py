"""The chained-style examples of the README run as written, and print what they say."""

from __future__ import annotations

import contextlib
import io
import os
import pathlib
import re

import pytest

import dataloader as dl
from tests.integration.conftest import no_leaks  # noqa: F401  (autouse: no child or block left)

README = pathlib.Path(__file__).resolve().parents[3] / "README.md"
SECTION = "## The dataset API"


def readme_blocks() -> list[str]:
    text = README.read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return re.findall(r"```python\n(.*?)```", text[start : end if end != -1 else None], re.S)


def expected_prints(block: str) -> list[str]:
    return [line.split("#", 1)[1].strip() for line in block.splitlines() if line.startswith("print(") and "#" in line]


def write_spec_files(root: pathlib.Path) -> None:
    (root / "data").mkdir()
    for name in ("a", "b"):
        for shard in range(2):
            dl.write_array_record(root / "data" / f"{name}-{shard}.array_record", [b"r%d" % i for i in range(4)])


def test_the_readme_has_the_chained_examples():
    blocks = readme_blocks()
    assert len(blocks) == 3
    assert "mp_prefetch(dl.MultiprocessingOptions(num_workers=2))" in blocks[0]


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize("number", range(3))
def test_readme_example_runs_as_written(number, tmp_path):
    block = readme_blocks()[number]
    write_spec_files(tmp_path)
    out = io.StringIO()
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(block, f"README.md example {number}", "exec"), {"__name__": "readme_example"})
    finally:
        os.chdir(old)
    assert out.getvalue().splitlines() == expected_prints(block)
