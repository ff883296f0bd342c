"""Re-runs a benchmark script in ``benchmarks/.venv`` (made by ``setup_env.sh``), where
the peers it measures are installed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
VENV = HERE / ".venv"


def ensure_venv(script: str, argv: list[str]) -> None:
    """Makes the environment if needed and re-executes ``script`` with ``argv`` in it;
    returns at once when already running there."""
    if Path(sys.prefix).resolve() == VENV.resolve():
        return
    subprocess.run(["bash", str(HERE / "setup_env.sh")], check=True)
    python = VENV / "bin" / "python"
    os.execv(str(python), [str(python), str(Path(script).resolve()), *argv])
