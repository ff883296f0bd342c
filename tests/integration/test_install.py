"""Installed, the project is one import name: a user's own modules never shadow ours.

The user's project below has its own ``operations.py``, ``samplers.py``, ``sources/``
and ``configs/`` (common names in ML code) and runs a loader with 2 workers from its own
folder, against the editable install and against a wheel built by ``pip``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from tests.helpers import REPO_ROOT

USER_FILES = {
    "operations.py": "class FilterTransform:  # a user's class of the same name\n    pass\n\n"
                     "def triple(x):\n    return x * 3\n",
    "samplers.py": "def keep(x):\n    return x % 2 == 0\n",
    "sources/__init__.py": "NAME = \"the user's sources\"\n",
    "configs/__init__.py": "BATCH = 4\n",
    "train.py": """\
import json
import sys

import dataloader as dl
import operations, samplers, sources
from configs import BATCH

assert sources.NAME == "the user's sources" and not hasattr(operations, "MapTransform")

def batches(workers):
    loader = dl.DataLoader(
        dl.RangeDataSource(60), dl.IndexSampler(60, shuffle=True, seed=5, num_epochs=1),
        [dl.MapTransform(operations.triple), dl.FilterTransform(samplers.keep), dl.Batch(BATCH)],
        worker_count=workers)
    return [b.tolist() for b in loader]

with_workers = batches(2)
assert with_workers == batches(0)
print(json.dumps({"batches": with_workers, "dataloader": dl.__file__,
                  "samplers": dl.samplers.__file__}))
""",
}


def _user_project(tmp_path) -> str:
    for name, text in USER_FILES.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(tmp_path)


def _run_user_script(project: str, env: dict[str, str] | None = None) -> dict:
    out = subprocess.run(
        [sys.executable, "train.py"], cwd=project, capture_output=True, text=True,
        env=env, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_a_users_own_operations_samplers_sources_and_configs_do_not_shadow_ours(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = _run_user_script(_user_project(tmp_path), env)
    values = [x for batch in result["batches"] for x in batch]
    assert sorted(values) == [3 * i for i in range(60) if (3 * i) % 2 == 0]
    assert result["samplers"] == os.path.join(REPO_ROOT, "samplers", "__init__.py")


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_the_wheel_installs_one_import_name_that_works_from_a_users_folder(tmp_path):
    # Build from a copy of the tracked files, so the checkout gets no build/ folder.
    tree = tmp_path / "tree"
    files = subprocess.run(["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    for name in files:
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.join(REPO_ROOT, name), tree / name)
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(tree)],
        check=True, capture_output=True, timeout=240,
    )
    (wheel,) = wheels.glob("granary-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    top = {name.split("/")[0] for name in names}
    # and the grain alias's startup hook (tests/dataloader/compat/test_startup_hook.py)
    assert {t for t in top if not t.endswith(".dist-info")} == {"dataloader", "granary-grain-alias.pth"}
    for module in ("dataloader/samplers/index_sampler.py", "dataloader/sources/array_record.py",
                   "dataloader/operations/batch.py", "dataloader/configs/demo.yaml",
                   "dataloader/engine/pool/worker.py"):
        assert module in names, module

    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        check=True, capture_output=True, timeout=120,
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    result = _run_user_script(_user_project(tmp_path / "project"), env)
    assert result["dataloader"].startswith(str(site))
    assert result["samplers"] == str(site / "dataloader" / "samplers" / "__init__.py")
