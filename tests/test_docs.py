"""Every code block of the README and of the documentation site runs as written.

A page is ``README.md`` or a Markdown file under ``docs/``. Each page gets one fresh,
empty folder, and its blocks run there in order, so a later block may read what an
earlier block of the same page wrote; nothing else is prepared: a page writes what it
reads. What a block is, is its fence's tag:

* ``python``: a script, run in a process of its own in the page's folder with this
  interpreter (the project and its ``test`` extra installed: a page says which extra
  a block needs). A line ``print(...)  # text`` must print exactly ``text``, and the
  script must print nothing else.
* ``python-multihost``: a script for several hosts. It runs as two JAX processes on
  this machine's CPU, joined through ``jax.distributed`` on ``127.0.0.1``: the
  environment gives ``COORDINATOR`` (host:port), ``NUM_PROCESSES`` (2) and ``RANK``
  (0 or 1). Both must succeed and print what the comments say.
* ``python-s3``: a script that reads and writes ``s3://my-bucket/...``. It runs against
  a local S3 server (moto) whose address is in ``AWS_ENDPOINT_URL``, with test
  credentials and region in the environment and the bucket ``my-bucket`` made, the way
  s3fs and boto find a real store's.
* ``bash``: each line runs in the page's folder (``make`` lines are checked with
  ``make -n`` in the repository: running them would recurse).
* ``yaml``: a pipeline config (with ``source:``) or a MaxText config (with
  ``grain_train_files:``) is checked as one, without its files.
* ``text``: not run (output, a tree, commands for a cluster this machine is not).

Any other tag fails: a new kind of block needs a runner here first.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest
import yaml

import dataloader as dl
from dataloader.config import parse_config
from tests.helpers import REPO_ROOT

ROOT = pathlib.Path(REPO_ROOT)
PAGES = sorted([ROOT / "README.md", *(p for p in (ROOT / "docs").rglob("*.md") if "hooks" not in p.parts)])
FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```\s*$", re.S | re.M)
RUN = {"python", "python-multihost", "python-s3", "bash"}
CHECKED = {"yaml"}
NOT_RUN = {"text"}
BUCKET = "my-bucket"
README_LINES = 300


def page_id(page: pathlib.Path) -> str:
    return str(page.relative_to(ROOT))


def blocks(page: pathlib.Path) -> list[tuple[str, str, int]]:
    """(tag, body, line) of every fenced block of ``page``, in order."""
    text = page.read_text()
    return [(m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1) for m in FENCE.finditer(text)]


def runnable(page: pathlib.Path) -> list[tuple[str, str, int]]:
    return [b for b in blocks(page) if b[0] in RUN]


def expected_prints(block: str) -> list[str]:
    return [line.split("#", 1)[1].strip() for line in block.splitlines()
            if line.startswith("print(") and "#" in line]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def environment() -> dict[str, str]:
    """A user's shell: this interpreter first on PATH, no PYTHONPATH, CPU devices."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "XLA_FLAGS")}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["JAX_PLATFORMS"] = "cpu"
    return env


@contextlib.contextmanager
def s3_environment(env: dict[str, str]) -> Iterator[dict[str, str]]:
    """A local S3 server with ``my-bucket``; the environment that points s3fs and boto at it."""
    import boto3

    from tests.sources._object_store import s3_server_process

    with s3_server_process() as endpoint:
        env = dict(env, AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="testing",
                   AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                     aws_secret_access_key="testing").create_bucket(Bucket=BUCKET)
        yield env


def run_script(where: str, body: str, folder: pathlib.Path, env: dict[str, str], number: int) -> None:
    script = folder / f"_block_{number}.py"
    script.write_text(body)
    out = subprocess.run([sys.executable, script.name], cwd=folder, env=env,
                         capture_output=True, text=True, timeout=600)
    script.unlink()
    assert out.returncode == 0, f"{where} failed:\n{body}\n{out.stderr[-4000:]}"
    assert out.stdout.splitlines() == expected_prints(body), f"{where} printed:\n{out.stdout}"


def run_multihost(where: str, body: str, folder: pathlib.Path, env: dict[str, str], number: int) -> None:
    script = folder / f"_block_{number}.py"
    script.write_text(body)
    coordinator = f"127.0.0.1:{free_port()}"
    procs = [subprocess.Popen([sys.executable, script.name], cwd=folder, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=dict(env, COORDINATOR=coordinator, NUM_PROCESSES="2", RANK=str(rank)))
             for rank in range(2)]
    outputs = []
    try:
        outputs = [proc.communicate(timeout=600) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    script.unlink()
    for rank, (proc, (stdout, stderr)) in enumerate(zip(procs, outputs)):
        assert proc.returncode == 0, f"{where}, process {rank} failed:\n{body}\n{stderr[-4000:]}"
        assert stdout.splitlines() == expected_prints(body), f"{where}, process {rank} printed:\n{stdout}"


def commands(block: str) -> list[str]:
    lines = [re.sub(r"\s+#.*$", "", line).strip() for line in block.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def run_bash(where: str, body: str, folder: pathlib.Path, env: dict[str, str]) -> None:
    for command in commands(body):
        if command.startswith("make "):
            out = subprocess.run(["make", "-n", *command.split()[1:]], cwd=ROOT, capture_output=True, text=True)
        else:
            out = subprocess.run(["bash", "-c", command], cwd=folder, env=env, capture_output=True,
                                 text=True, timeout=600)
        assert out.returncode == 0, f"{where}: {command!r} failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_block_has_a_known_tag(page):
    for tag, body, line in blocks(page):
        assert tag in RUN | CHECKED | NOT_RUN, (
            f"{page_id(page)}:{line}: a block tagged {tag!r}; use one of "
            f"{sorted(RUN | CHECKED | NOT_RUN)} (see tests/test_docs.py)")
        assert body.strip(), f"{page_id(page)}:{line}: an empty block"


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("page", [p for p in PAGES if runnable(p)], ids=page_id)
def test_page_runs_top_to_bottom_in_an_empty_folder(page, tmp_path):
    env = environment()
    with contextlib.ExitStack() as stack:
        for number, (tag, body, line) in enumerate(runnable(page)):
            where = f"{page_id(page)}:{line} ({tag} block {number})"
            if tag == "python":
                run_script(where, body, tmp_path, env, number)
            elif tag == "python-multihost":
                run_multihost(where, body, tmp_path, env, number)
            elif tag == "python-s3":
                if "AWS_ENDPOINT_URL" not in env:
                    env = stack.enter_context(s3_environment(env))
                run_script(where, body, tmp_path, env, number)
            else:
                run_bash(where, body, tmp_path, env)


@pytest.mark.parametrize("page", [p for p in PAGES if any(t == "yaml" for t, _, _ in blocks(p))], ids=page_id)
def test_yaml_blocks_are_valid_configs(page):
    for _, body, line in (b for b in blocks(page) if b[0] == "yaml"):
        data = yaml.safe_load(body)
        assert isinstance(data, dict), f"{page_id(page)}:{line}: a yaml block that is not a mapping"
        if "source" in data or "mixture" in data:
            parse_config(data, check_files=False)
        elif "grain_train_files" in data:
            dl.maxtext.parse_maxtext_config(data)


def test_the_readme_is_short_and_links_into_the_site():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= README_LINES, "the README is the front door: keep it short, write on a docs page"
    links = re.findall(r"\]\((docs/[^)#]+\.md)(?:#[^)]*)?\)", text)
    assert len(links) >= 10
    missing = sorted({link for link in links if not (ROOT / link).is_file()})
    assert not missing, f"the README links to pages that do not exist: {missing}"


def test_every_page_is_in_the_site_navigation():
    nav = (ROOT / "mkdocs.yml").read_text()
    listed = set(re.findall(r"([\w/-]+\.md)", nav))
    pages = {str(p.relative_to(ROOT / "docs")) for p in PAGES if p.name != "README.md"}
    assert pages - listed == set(), "add each page to the nav of mkdocs.yml"
    assert listed - pages == set(), "mkdocs.yml lists a page that does not exist"


def test_the_reference_names_every_public_name():
    """Each name of ``dl.__all__`` has its ``::: dataloader....Name`` entry on a page of
    docs/reference, and the reference's index links to every entry."""
    reference = ROOT / "docs" / "reference"
    entries = {path for page in reference.glob("*.md")
               for path in re.findall(r"^::: (\S+)$", page.read_text(), re.M)}
    missing = sorted(set(dl.__all__) - {path.rsplit(".", 1)[1] for path in entries})
    assert not missing, f"add these public names to a page of docs/reference: {missing}"
    listed = set(re.findall(r"\]\[(dataloader\.[\w.]+)\]", (reference / "index.md").read_text()))
    unlisted = sorted(entries - listed - {"dataloader.maxtext", "dataloader.compat"})
    assert not unlisted, f"add these entries to the table of docs/reference/index.md: {unlisted}"
