"""``GRANARY_GRAIN_ALIAS=1 python train.py`` runs a ``train.py`` that imports grain first.

The install puts ``granary-grain-alias.pth`` in site-packages; Python runs its line at
every start. These tests run real interpreters of this environment, so they need granary
installed with the hook (``pip install -e .`` or ``pip install .`` of this tree).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import pytest

from dataloader.compat import ENV_VAR
from tests.helpers import REPO_ROOT

HOOK = "granary-grain-alias.pth"

# The import forms of code that cannot be edited (MaxText, torchtitan, Grain's docs), each
# as the first line of the script.
FIRST_LINES = [
    "import grain",
    "import grain.python as grain",
    "from grain import python as grain",
]
BODY = """
import sys
print(type(grain).__name__, grain.MapDataset is sys.modules["dataloader"].MapDataset)
print(grain.MapDataset.range(6).map(lambda x: x * 10).batch(3)[1].tolist())
"""


def _script(folder, first_line: str):
    path = folder / "train.py"
    path.write_text(first_line + "\n" + BODY)
    return path


def _python(args, cwd, value: str | None = None, pythonpath: str | None = None):
    env = {k: v for k, v in os.environ.items() if k not in (ENV_VAR, "PYTHONPATH")}
    if value is not None:
        env[ENV_VAR] = value
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def _fake_grain(folder) -> None:
    """A package named grain in ``folder``: what a real installed Grain looks like."""
    (folder / "grain").mkdir(parents=True)
    (folder / "grain" / "__init__.py").write_text("REAL = True\nMapDataset = 'real'\n")
    (folder / "grain" / "python.py").write_text("from grain import MapDataset\n")


def test_the_hook_is_installed_beside_the_packages():
    hook = os.path.join(sysconfig.get_paths()["purelib"], HOOK)
    assert os.path.exists(hook), (
        f"{hook} is missing: this environment's granary was installed before the hook; "
        f"reinstall it (pip install -e .)")
    with open(hook, encoding="utf-8") as f:
        assert f.read().startswith("import os; ")  # site runs lines that start with import


@pytest.mark.parametrize("first_line", FIRST_LINES)
def test_the_variable_alone_runs_a_script_whose_first_line_imports_grain(tmp_path, first_line):
    script = _script(tmp_path, first_line)
    out = _python([str(script)], tmp_path, value="1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["GrainAliasModule True", "[30, 40, 50]"]


@pytest.mark.parametrize("value", [None, "", "0"])
def test_without_the_variable_grain_is_not_there_and_granary_is_not_imported(tmp_path, value):
    out = _python([str(_script(tmp_path, "import grain"))], tmp_path, value=value)
    assert out.returncode != 0
    assert "ModuleNotFoundError: No module named 'grain'" in out.stderr
    started = _python(["-c", "import sys; print('dataloader' in sys.modules)"], tmp_path, value=value)
    assert started.returncode == 0, started.stderr
    assert started.stdout.strip() == "False"  # the hook imported nothing


def test_an_installed_real_grain_is_kept_with_a_warning_unless_forced(tmp_path):
    site = tmp_path / "site"
    _fake_grain(site)
    script = _script(tmp_path, "import grain.python as grain")
    kept = _python([str(script)], tmp_path, value="1", pythonpath=str(site))
    assert kept.returncode != 0  # the fake Grain has no .range: it really was the one imported
    assert "AttributeError: 'str' object has no attribute 'range'" in kept.stderr
    assert f"train.py:1: RuntimeWarning: {ENV_VAR}=1 is ignored: a real Grain is installed" in kept.stderr
    forced = _python([str(script)], tmp_path, value="force", pythonpath=str(site))
    assert forced.returncode == 0, forced.stderr
    assert forced.stdout.splitlines() == ["GrainAliasModule True", "[30, 40, 50]"]


def test_without_the_variable_a_real_grain_is_imported_untouched(tmp_path):
    site = tmp_path / "site"
    _fake_grain(site)
    (tmp_path / "train.py").write_text("import sys, grain\nprint(grain.REAL, 'dataloader' in sys.modules)\n")
    out = _python(["train.py"], tmp_path, pythonpath=str(site))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True False" and "Warning" not in out.stderr


def test_a_real_grain_beside_the_script_is_seen_though_the_hook_ran_before_its_folder_was_on_sys_path(tmp_path):
    """The hook runs as Python starts, before the script's folder joins sys.path: the
    check for a real Grain waits for the first `import grain`."""
    _fake_grain(tmp_path)
    (tmp_path / "train.py").write_text("import grain\nprint(grain.REAL)\n")
    out = _python(["train.py"], tmp_path, value="1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"
    assert "RuntimeWarning: GRANARY_GRAIN_ALIAS=1 is ignored: a real Grain is installed" in out.stderr


def test_a_program_that_never_imports_grain_gets_no_warning_about_a_real_one(tmp_path):
    site = tmp_path / "site"
    _fake_grain(site)
    out = _python(["-c", "import dataloader.compat as c; print(c.is_installed())"], tmp_path,
                  value="1", pythonpath=str(site))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True" and "RuntimeWarning" not in out.stderr


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_both_wheels_pip_installs_carry_the_hook_at_their_root(tmp_path):
    """`pip install .` installs the wheel, `pip install -e .` the editable wheel: both
    put their root files in site-packages, so both must hold the hook."""
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in ("setup.py", "setup.cfg", "README.md"):
        shutil.copy(os.path.join(REPO_ROOT, name), tree / name)
    for folder in ("dataloader", "samplers", "sources", "operations", "configs"):
        shutil.copytree(os.path.join(REPO_ROOT, folder), tree / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp_path / "dist"
    dist.mkdir()
    wheels = []
    for hook in ("build_wheel", "build_editable"):  # one process per hook, as pip runs them
        out = subprocess.run(
            [sys.executable, "-c", f"import sys, setuptools.build_meta as b; print(b.{hook}(sys.argv[1]))", str(dist)],
            cwd=tree, capture_output=True, text=True, timeout=280)
        assert out.returncode == 0, out.stderr[-3000:]
        wheels.append(out.stdout.splitlines()[-1])  # setuptools logs to stdout before
    assert wheels[0].endswith("-py3-none-any.whl") and ".editable-" in wheels[1]
    lines = []
    for wheel in wheels:
        with zipfile.ZipFile(dist / wheel) as z:
            assert HOOK in z.namelist(), f"{wheel} lacks {HOOK}: {sorted(z.namelist())[:20]}"
            lines.append(z.read(HOOK).decode())
    assert lines[0] == lines[1]
    assert lines[0].startswith("import os; ") and ENV_VAR in lines[0] and "__import__('dataloader')" in lines[0]
