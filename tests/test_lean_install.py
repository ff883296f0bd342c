"""Each ``make`` target installs what it needs and nothing more, and no extra pulls CUDA.

``make demo`` in a fresh clone must build an environment without torch, Ray or Beam (it
was 6.4 GB when it installed the test extra too), and the extras that need torch pin its
CPU build on Linux x86_64, where PyPI carries only CUDA builds (several GB with NVIDIA's
libraries and Triton). These tests read the Makefile's commands (``make -n``, nothing
runs) and setup.cfg, and walk the installed distributions' requirements, so they need
neither the network nor a new environment.
"""

from __future__ import annotations

import configparser
import os
import re
import shlex
import subprocess
from importlib import metadata

import pytest
from packaging.requirements import Requirement

from tests.helpers import REPO_ROOT

# What the demo's environment must not hold: the test extra's heavy libraries.
HEAVY = {"torch", "ray", "apache-beam", "moto", "triton"}
LINUX_X86 = {"platform_system": "Linux", "platform_machine": "x86_64", "sys_platform": "linux"}


def _name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _setup_cfg() -> configparser.ConfigParser:
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(REPO_ROOT, "setup.cfg"))
    return cfg


def _requirements(text: str) -> list[Requirement]:
    lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return [Requirement(line) for line in lines if line]


def _extra(extra: str) -> list[Requirement]:
    return _requirements(_setup_cfg()["options.extras_require"][extra])


def _pip_installs(target: str, tmp_path) -> list[str]:
    """What ``make <target>`` installs into a new venv, in order (``make -n``: printed, not run)."""
    out = subprocess.run(["make", "-n", target, f"VENV={tmp_path / 'venv'}"], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    installs = []
    for line in out.stdout.splitlines():
        words = shlex.split(line.split("||", 1)[0])  # the CPU-index fallback repeats the install
        if words[1:4] == ["-m", "pip", "install"]:
            installs.append(" ".join(w for w in words[4:] if w != "-q"))
    return installs


@pytest.mark.parametrize(("target", "installs"), [
    ("demo", ["--upgrade pip", "-e .", "-e .[demo]"]),
    ("install", ["--upgrade pip", "-e ."]),
    ("test", ["--upgrade pip", "-e .", "-e .[test,dev]"]),
    ("lint", ["--upgrade pip", "-e .", "-e .[test,dev]"]),
    ("docs", ["--upgrade pip", "-e .", "-e .[docs]"]),
])
def test_each_target_installs_the_package_and_its_own_extras_only(tmp_path, target, installs):
    assert _pip_installs(target, tmp_path) == installs


def test_an_existing_venv_is_kept_and_only_pip_runs_in_it(tmp_path):
    """A stamp made again (setup.cfg changed, or a venv from before the stamps) installs
    into the venv there; `python -m venv` over it would rewrite its scripts in place."""
    log = tmp_path / "calls"
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    for path in (venv / "bin" / "python", tmp_path / "python3"):  # each logs its arguments
        path.write_text(f'#!/bin/sh\necho "$0 $*" >> {log}\n')
        path.chmod(0o755)
    out = subprocess.run(["make", "install", f"VENV={venv}", f"PYTHON={tmp_path / 'python3'}"],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert log.read_text().splitlines() == [
        f"{venv}/bin/python -m pip install -q --upgrade pip", f"{venv}/bin/python -m pip install -q -e ."]
    assert (venv / ".base-stamp").exists()


def _closure(requirements: list[Requirement]) -> set[str]:
    """The distributions these requirements bring on Linux x86_64, from the installed
    distributions' metadata (this environment holds every extra)."""
    seen: set[str] = set()
    todo = [(r, "") for r in requirements]
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({**LINUX_X86, "extra": extra}):
            continue
        name = _name(req.name)
        key = f"{name}[{','.join(sorted(req.extras))}]"
        if key in seen:
            continue
        seen.add(key)
        for sub in metadata.distribution(req.name).requires or []:
            todo.extend((Requirement(sub), e) for e in ("", *req.extras))
    return {key.split("[", 1)[0] for key in seen}


def test_the_demo_environment_holds_no_torch_ray_beam_or_moto():
    cfg = _setup_cfg()
    needed = _closure(_requirements(cfg["options"]["install_requires"]) + _extra("demo"))
    assert {"jax", "array-record", "scikit-learn", "tokenizers"} <= needed  # the walk reached them
    heavy = {n for n in needed if n in HEAVY or n.startswith("nvidia-")}
    assert not heavy, f"the base install and the demo extra bring {sorted(heavy)}"


@pytest.mark.parametrize("extra", ["test", "docs"])
def test_torch_is_pinned_to_its_cpu_build_on_linux_x86_64(extra):
    torch = [r for r in _extra(extra) if _name(r.name) == "torch"]
    on_linux = [str(r.specifier) for r in torch if r.marker is None or r.marker.evaluate(LINUX_X86)]
    assert len(on_linux) == 1 and re.fullmatch(r"==\d+\.\d+\.\d+\+cpu", on_linux[0]), (
        f"the {extra} extra must pin torch's CPU build (==X.Y.Z+cpu) on Linux x86_64, where "
        f"PyPI's torch is the CUDA build; got {[str(r) for r in torch]}")
    # elsewhere PyPI's wheel is the CPU build (no +cpu wheel exists for macOS): the same release
    for platform in ({"platform_system": "Darwin", "platform_machine": "arm64", "sys_platform": "darwin"},
                     {"platform_system": "Linux", "platform_machine": "aarch64", "sys_platform": "linux"}):
        there = [str(r.specifier) for r in torch if r.marker is None or r.marker.evaluate(platform)]
        assert there == [on_linux[0].removesuffix("+cpu")], (platform, there)


def test_no_other_extra_brings_torch():
    extras = _setup_cfg()["options.extras_require"]
    with_torch = sorted(e for e in extras if any(_name(r.name) == "torch" for r in _extra(e)))
    assert with_torch == ["docs", "test"]
