"""``python -m dataloader.compat script.py [args]`` runs Grain code as ``python script.py``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dataloader.compat import ENV_VAR

SCRIPT = '''
import os, sys
import grain.python as grain
import dataloader as dl

print(__name__, sys.argv[1:], os.path.basename(sys.argv[0]))
print(sys.path[0] == os.path.dirname(os.path.abspath(__file__)))
print(grain.MapDataset is dl.MapDataset)
'''

# A script without a __main__ guard whose lambda (pickled by value from __main__) runs in
# workers started as interpreters (no fork server): they need the alias from the
# environment to unpickle a function that refers to the grain module.
WORKER_SCRIPT = '''
import numpy as np
import grain.python as grain

loader = grain.DataLoader(
    data_source=grain.RangeDataSource(24),
    sampler=grain.IndexSampler(24, shuffle=True, seed=1, num_epochs=1),
    operations=[grain.MapTransform(lambda x: grain.__name__ + str(x)), grain.Batch(6)],
    worker_count=2, warm_start=False)
print([list(b) for b in loader][0][:2])
'''


def _run(args, cwd, **extra_env):
    env = {k: v for k, v in os.environ.items() if k not in (ENV_VAR, "PYTHONPATH")}
    env.update(extra_env)
    return subprocess.run([sys.executable, "-m", "dataloader.compat", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_a_script_runs_as_main_with_its_arguments_and_folder(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "train.py").write_text(SCRIPT)
    out = _run(["sub/train.py", "--steps", "3"], tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["__main__ ['--steps', '3'] train.py", "True", "True"]


def test_c_and_m_run_code_and_modules_the_same_way(tmp_path):
    (tmp_path / "grain_job.py").write_text(SCRIPT.replace("__file__", "'grain_job.py'"))
    code = _run(["-c", "import sys, grain; print(__name__, sys.argv, grain.__name__)", "x"], tmp_path)
    assert code.returncode == 0, code.stderr
    assert code.stdout.strip() == "__main__ ['-c', 'x'] grain"
    module = _run(["-m", "grain_job", "y"], tmp_path)
    assert module.returncode == 0, module.stderr
    assert module.stdout.splitlines()[0] == "__main__ ['y'] grain_job.py"


def test_the_script_exit_status_is_the_commands(tmp_path):
    (tmp_path / "fails.py").write_text("import grain\nraise SystemExit(3)\n")
    assert _run(["fails.py"], tmp_path).returncode == 3


@pytest.mark.parametrize("args", [[], ["-m"], ["-c"]])
def test_without_something_to_run_it_prints_its_usage(tmp_path, args):
    out = _run(args, tmp_path)
    assert out.returncode == 2
    assert "usage: python -m dataloader.compat (script.py | -m module | -c code)" in out.stderr


def test_a_missing_script_is_named(tmp_path):
    out = _run(["nope.py"], tmp_path)
    assert out.returncode != 0
    assert "can't open file 'nope.py'" in out.stderr


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_workers_started_as_interpreters_have_the_alias(tmp_path):
    (tmp_path / "job.py").write_text(WORKER_SCRIPT)
    out = _run(["job.py"], tmp_path, GRANARY_FORK_SERVER="0")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith("['grain")
