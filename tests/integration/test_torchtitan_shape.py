"""torchtitan's Grain loader shape on granary: worker processes for packed and mixed
pipelines without a change to the pipeline, the same torch batches for every worker count,
exact resume, and no JAX in the process.

torchtitan never calls ``mp_prefetch`` (its loader is threads only; its
``TODO(data-multiprocessing)`` asks for one shared worker pool for packed and mixed
pipelines). ``GRANARY_WORKER_COUNT`` gives the engine-backed part of such a pipeline (the
source, filters and the sample processor) worker processes; packing, batching with the
torch collator and the thread prefetch run on the ordered stream in this process.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import dataloader as dl
from tests.helpers import REPO_ROOT
from tests.integration import torchtitan_pipelines as tt

pytestmark = pytest.mark.multiprocess

READ = dl.ReadOptions(num_threads=1, prefetch_buffer_size=1)
CONTEXT_LENGTH = 24
ROW_TOKENS = 32


def collate(rows: list[tt.TextSequence]) -> dict[str, torch.Tensor]:
    """torchtitan's collator shape: a batch of torch tensors, one row per sequence."""
    return {
        "input": torch.stack([torch.from_numpy(r.input_ids) for r in rows]),
        "labels": torch.stack([torch.from_numpy(r.labels) for r in rows]),
        "positions": torch.stack([torch.from_numpy(r.positions) for r in rows]),
    }


def packed(pid_file: str | None = None) -> dl.IterDataset:
    ds = tt.single(tt.rows(300), seed=42, rank=1, world=2, pid_file=pid_file)
    ds = tt.first_fit_packed(ds, seed=42, max_context_length=CONTEXT_LENGTH, tokens_per_row=ROW_TOKENS,
                             read_options=READ)
    return tt.loader_stream(ds, rows_per_batch=4, collator=collate, read_options=READ)


def mixture(pid_file: str | None = None) -> dl.IterDataset:
    parts = [tt.single(tt.rows(200, salt=s), seed=42 + s, pid_file=pid_file) for s in range(2)]
    ds = tt.mixed(parts, weights=[1.0, 3.0]).map(
        lambda s: tt.TextSequence(input_ids=s.input_ids[:8], labels=s.labels[:8],
                                  positions=np.arange(len(s.input_ids[:8]))))
    ds = ds.filter(lambda s: len(s.input_ids) == 8)
    return tt.loader_stream(ds, rows_per_batch=4, collator=collate, read_options=READ)


def batches(ds: dl.IterDataset, count: int, workers: int = 0) -> list[dict[str, torch.Tensor]]:
    it = iter(ds)
    try:
        out = [next(it) for _ in range(count)]
        assert it.stats()["pipeline"]["worker_count"] == workers
        return out
    finally:
        it.close()


def assert_same(a: list[dict[str, torch.Tensor]], b: list[dict[str, torch.Tensor]]) -> None:
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b)):
        assert x.keys() == y.keys(), i
        for key in x:
            assert x[key].dtype == y[key].dtype, (i, key)
            assert torch.equal(x[key], y[key]), (i, key)


def pids_in(path: str) -> set[int]:
    with open(path) as f:
        return {int(line) for line in f if line.strip()}


@pytest.mark.parametrize("build", [packed, mixture], ids=["first_fit_packed", "mixed"])
def test_worker_count_from_the_environment_gives_workers_and_the_same_torch_batches(build, tmp_path, monkeypatch):
    monkeypatch.delenv("GRANARY_WORKER_COUNT", raising=False)
    here = tmp_path / "here"
    alone = batches(build(str(here)), 12)
    assert pids_in(str(here)) == {os.getpid()}

    monkeypatch.setenv("GRANARY_WORKER_COUNT", "2")
    with_workers = batches(build(), 12, workers=2)

    assert_same(alone, with_workers)
    assert isinstance(with_workers[0]["input"], torch.Tensor)
    assert with_workers[0]["input"].shape[0] == 4


def test_packed_rows_are_torchtitans_rows(monkeypatch):
    """The packed rows hold whole documents: labels are the inputs shifted (or masked),
    padding is masked, positions restart at every document."""
    monkeypatch.delenv("GRANARY_WORKER_COUNT", raising=False)
    for batch in batches(packed(), 6):
        assert batch["input"].shape == (4, ROW_TOKENS)
        inputs, labels, positions = (batch[k].numpy() for k in ("input", "labels", "positions"))
        for row in range(4):
            starts = np.flatnonzero(positions[row] == 0)
            assert starts[0] == 0
            for a, b in zip(starts, [*starts[1:], ROW_TOKENS]):
                doc = inputs[row, a:b]
                if doc[0] == 0:  # padding to the end of the row
                    assert (labels[row, a:b] == tt.IGNORE_INDEX).all()
                    continue
                assert doc[0] == tt.BOS
                shifted = labels[row, a:b - 1]
                kept = shifted != tt.IGNORE_INDEX
                assert (shifted[kept] == doc[1:][kept]).all()


@pytest.mark.parametrize(("saved_with", "restored_with"), [("2", "0"), ("0", "2")])
def test_a_state_saved_with_workers_resumes_without_them_and_back(saved_with, restored_with, monkeypatch):
    monkeypatch.setenv("GRANARY_WORKER_COUNT", "0")
    expected = batches(packed(), 10)

    monkeypatch.setenv("GRANARY_WORKER_COUNT", saved_with)
    it = iter(packed())
    try:
        for _ in range(6):
            next(it)
        state = json.loads(json.dumps(it.get_state()))  # torchtitan stores it as JSON-able data
    finally:
        it.close()

    monkeypatch.setenv("GRANARY_WORKER_COUNT", restored_with)
    resumed = iter(packed())
    try:
        resumed.set_state(state)
        rest = [next(resumed) for _ in range(4)]
    finally:
        resumed.close()
    assert_same(expected[6:], rest)


def test_a_bad_worker_count_in_the_environment_is_named(monkeypatch):
    monkeypatch.setenv("GRANARY_WORKER_COUNT", "lots")
    with pytest.raises(dl.ConfigError, match=r"GRANARY_WORKER_COUNT='lots': expected a worker count"):
        iter(packed())


def test_grain_code_unchanged_runs_on_workers_with_torch_batches_and_no_jax(tmp_path):
    """A script written for Grain (``import grain.python as grain``), run with the alias and
    a worker count from the environment: its samples are processed in workers, its
    batches are torch tensors, and neither this process nor its workers import JAX."""
    script = tmp_path / "train_data.py"
    script.write_text(textwrap.dedent("""
        import os, sys
        import numpy as np
        import torch
        import grain.python as grain
        from grain import experimental as grain_experimental

        def tokenize(row, rng):
            with open(os.environ["PID_FILE"], "a") as f:
                f.write(f"{os.getpid()} {'jax' in sys.modules}\\n")
            ids = np.frombuffer(row.encode(), np.uint8).astype(np.int64)
            return {"input_ids": ids, "labels": ids}

        rows = [("doc %d " % i) * (1 + i % 5) for i in range(400)]
        ds = grain.MapDataset.source(rows).random_map(tokenize, seed=7).shuffle(seed=7)
        ds = ds.to_iter_dataset(read_options=grain.ReadOptions(num_threads=1, prefetch_buffer_size=1))
        ds = grain_experimental.ConcatThenSplitIterDataset(ds, length_struct={"input_ids": 16, "labels": 16})
        ds = ds.batch(8, drop_remainder=True, batch_fn=lambda rows: {
            k: torch.stack([torch.from_numpy(r[k]) for r in rows]) for k in ("input_ids", "labels")})
        ds = grain_experimental.ThreadPrefetchIterDataset(ds, prefetch_buffer_size=2)
        it = iter(ds)
        out = [next(it) for _ in range(20)]
        it.close()
        print(type(out[0]["input_ids"]).__name__, "x".join(map(str, out[0]["input_ids"].shape)),
              int(sum(int(b["input_ids"].sum()) for b in out)), "jax" in sys.modules, os.getpid())
    """))
    results = []
    for workers in ("0", "2"):
        pid_file = tmp_path / f"pids-{workers}"
        env = dict(os.environ, GRANARY_WORKER_COUNT=workers, PID_FILE=str(pid_file),
                   PYTHONPATH=REPO_ROOT)
        env.pop("GRANARY_GRAIN_ALIAS", None)
        done = subprocess.run([sys.executable, "-m", "dataloader.compat", str(script)], env=env,
                              capture_output=True, text=True, timeout=240, check=False)
        assert done.returncode == 0, done.stderr
        kind, shape, total, jax_imported, pid = done.stdout.split()
        results.append((kind, shape, total, jax_imported))
        seen = [line.split() for line in pid_file.read_text().splitlines()]
        assert {jax for _, jax in seen} == {"False"}
        assert pid.isdigit()
    assert results[0] == results[1]
    assert results[0] == ("Tensor", "8x16", results[0][2], "False")


class Unrebuildable:
    """Pickles, but cannot be rebuilt in another process (its ``__setstate__`` refuses)."""

    def __init__(self) -> None:
        self.vocab = {"a": 1}

    def __setstate__(self, state: dict) -> None:
        raise RuntimeError("no vocabulary file in this process")


def chat_packed(tokenizer: tt.ChatTemplateTokenizer) -> dl.IterDataset:
    ds = tt.single(tt.rows(300), seed=42, processor=tt.ChatProcessor(tokenizer))
    ds = tt.first_fit_packed(ds, seed=42, max_context_length=CONTEXT_LENGTH * 4, tokens_per_row=ROW_TOKENS * 4,
                             read_options=READ)
    return tt.loader_stream(ds, rows_per_batch=4, collator=collate, read_options=READ)


def test_a_tokenizer_holding_a_compiled_chat_template_runs_on_workers(monkeypatch):
    """torchtitan's tokenizers compile their chat template (a jinja2.Template, which
    pickles but did not unpickle: 'Template.__new__() missing 1 required positional
    argument'); its sample processor now runs on 2 workers, with the same batches."""
    monkeypatch.setenv("GRANARY_WORKER_COUNT", "0")
    alone = batches(chat_packed(tt.ChatTemplateTokenizer(tt.CHAT_TEMPLATE)), 8)
    monkeypatch.setenv("GRANARY_WORKER_COUNT", "2")
    with_workers = batches(chat_packed(tt.ChatTemplateTokenizer(tt.CHAT_TEMPLATE)), 8, workers=2)
    assert_same(alone, with_workers)
    first_row = alone[0]["input"][0].numpy()
    assert first_row[0] == tt.BOS
    assert bytes(int(t) - 3 for t in first_row[1:7]) == b"<user>"  # rendered by the template


def test_an_object_that_cannot_be_unpickled_in_a_worker_is_named_by_its_path(monkeypatch):
    tokenizer = tt.ChatTemplateTokenizer(tt.CHAT_TEMPLATE)
    tokenizer.vocab = Unrebuildable()
    monkeypatch.setenv("GRANARY_WORKER_COUNT", "2")
    with pytest.raises(TypeError) as info:
        batches(chat_packed(tokenizer), 1, workers=2)
    message = str(info.value)
    assert re.search(r"operations\[\d+\]\S*\._tokenizer\.vocab \(a tests\.integration\.test_torchtitan_shape"
                     r"\.Unrebuildable: ", message), message
    assert "pickles but cannot be unpickled" in message
    assert "RuntimeError: no vocabulary file in this process" in message
    assert "register_reducer(Unrebuildable" in message
