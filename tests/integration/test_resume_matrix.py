"""granary's columns of the public resume matrix (benchmarks/resume_matrix.py), in
``--quick`` mode, in this environment (no peers installed: the script imports a peer
only for its own column): every cell must be ok."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "resume_matrix.py")


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(1500)
def test_every_granary_cell_of_the_resume_matrix_is_ok(tmp_path):
    out = tmp_path / "matrix.json"
    run = subprocess.run(
        [sys.executable, SCRIPT, "--here", "--quick", "--loaders", "granary,granary-dataset",
         "--json", str(out), "--workdir", str(tmp_path / "runs")],
        capture_output=True, text=True, timeout=1400,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert len(result["scenarios"]) >= 10
    assert set(result["loaders"]) == {"granary", "granary-dataset"}
    bad = {
        (name, scenario): cell
        for name, cells in result["loaders"].items()
        for scenario, cell in cells.items()
        if not (cell["ok"] and cell["lost"] == 0 and cell["repeated"] == 0)
    }
    assert not bad, json.dumps(bad, indent=1)
    # The changed source is noticed by a refusal that names what changed.
    for name in result["loaders"]:
        assert "StateMismatchError" in result["loaders"][name]["source_changed"]["note"]
        assert result["loaders"][name]["mid_epoch"]["order"] is True


def test_a_peer_that_is_not_installed_gets_a_cell_that_says_so(tmp_path):
    """The columns of loaders missing here are filled, never left out."""
    out = tmp_path / "matrix.json"
    run = subprocess.run(
        [sys.executable, SCRIPT, "--here", "--quick", "--loaders", "mosaic-streaming",
         "--scenarios", "mid_epoch,elastic", "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    cells = json.loads(out.read_text())["loaders"]["mosaic-streaming"]
    assert set(cells) == {"mid_epoch", "elastic"}
    for cell in cells.values():
        assert cell["ok"] is False
        assert cell["note"].startswith("not installed: mosaicml-streaming")
