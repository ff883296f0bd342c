"""MosaicML ``streaming``: ``StreamingDataset`` read through ``StreamingDataLoader``,
checkpointed with ``loader.state_dict()`` and resumed with ``load_state_dict(state)`` on
a new loader (its "Fast Resumption" page).

mosaicml-streaming (every release up to 0.13.0, the newest) requires ``numpy<2.2`` and
``transformers<5``, which cannot sit beside JAX and granary's numpy 2.4, so this column's
processes run in an environment of their own, ``benchmarks/.venv-mosaic`` (made by
``benchmarks/setup_env.sh``); they import numpy, torch and ``streaming``, never granary.

The data is MDS shards written with ``streaming.MDSWriter`` (:mod:`resume.data`). A
sample's id comes from ``__getitem__`` of a ``StreamingDataset`` subclass, the way
MosaicML's own datasets transform a sample. Its stream has no filter, flat map or packer:
as for LitData, those run where MosaicML's tooling puts them, at conversion (the samples
written are already filtered, flattened or packed into rows). The mixture is two
``Stream``\\s with ``proportion`` 0.3 / 0.7. Several hosts would be nodes as a launcher
makes them (``WORLD_SIZE``, ``RANK``, ``LOCAL_WORLD_SIZE``), each loading the state rank
0 saved (it counts every rank's samples); the elastic row is not measured (see
:data:`ELASTIC`). Each process reads the shards through a cache folder of its own, as a new
job on a new machine does (``remote`` is the data folder, ``local`` a fresh cache).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import sys
import tempfile
import types
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from resume import common
from resume.base import Column, OnHost
from resume.torch_cols import EpochRun

ENVIRONMENT = ".venv-mosaic"
ELASTIC = (
    "not measured here: with WORLD_SIZE > 1, StreamingDataset's constructor joins a "
    "torch.distributed process group (maybe_init_dist: init_process_group over the env:// "
    "rendezvous, MASTER_ADDR and MASTER_PORT, then barriers across ranks), so each rank needs "
    "a process of its own, and this harness runs a job's hosts in one process (tried: "
    "'ValueError: Error initializing torch.distributed using env:// rendezvous: environment "
    "variable MASTER_ADDR expected, but not set'); streaming documents elastic resumption "
    "(its 'Elastic Determinism' page: the global batch kept and divisible by every world size)"
)
HERE_WHY = (
    "mosaicml-streaming is not installed in this interpreter: every release up to 0.13.0 "
    "requires numpy<2.2.0 and transformers<5, which JAX and granary's numpy 2.4 exclude, so "
    "its column runs in an environment of its own, benchmarks/.venv-mosaic (made by "
    "benchmarks/setup_env.sh), which --here does not use"
)


BENCHMARKS = Path(__file__).resolve().parent.parent


def streaming() -> ModuleType:
    """MosaicML's ``streaming`` package. The matrix's processes have benchmarks/ on
    ``sys.path`` (for :mod:`resume`), where benchmarks/streaming.py, a benchmark script,
    has the same name: the package is imported with that folder left out.

    Its ``__init__`` also imports ``streaming.vision`` (image data sets), which imports
    ``torchvision.datasets.VisionDataset`` and ``to_tensor``. torchvision is not installed
    in benchmarks/.venv-mosaic: PyPI's wheel is built for PyPI's (CUDA) torch and fails to
    load beside torch's CPU build, and the CPU wheel's index may be out of reach; nothing
    here uses the image data sets, so placeholders stand in for those two names."""
    if importlib.util.find_spec("torchvision") is None:
        _stand_in_for_torchvision()
    module = sys.modules.get("streaming")
    if module is not None and Path(module.__file__ or "").resolve().parent == BENCHMARKS:
        raise ImportError("benchmarks/streaming.py was imported as 'streaming'; MosaicML's package cannot be")
    if module is None:
        saved = sys.path[:]
        sys.path[:] = [p for p in saved if Path(p or ".").resolve() != BENCHMARKS]
        try:
            module = importlib.import_module("streaming")
        finally:
            sys.path[:] = saved
    return module


def _stand_in_for_torchvision() -> None:
    def never(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("torchvision is not installed in benchmarks/.venv-mosaic")

    names = {"torchvision.datasets": {"VisionDataset": type("VisionDataset", (), {"__init__": never})},
             "torchvision.transforms.functional": {"to_tensor": never}}
    for name in ("torchvision", "torchvision.transforms", *names):
        module = sys.modules.setdefault(name, types.ModuleType(name))
        # A spec, as a module has one (transformers asks find_spec whether it is there,
        # then finds no installed distribution and takes it as absent).
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        for attr, value in names.get(name, {}).items():
            setattr(module, attr, value)


def _ids(scenario: str, batch: Any) -> list[int]:
    if scenario == "packing":
        return common.token_ids(batch["tokens"].numpy())
    return [int(x) for x in batch["id"]]


def _dataset_class() -> Any:
    class Records(streaming().StreamingDataset):
        """The samples' ids (record id, + B_OFFSET for the mixture's second stream)."""

        packed = False  # rows of tokens: handed out as they are (tokens are counted)

        def __getitem__(self, idx: int) -> dict:
            sample = super().__getitem__(idx)
            if "id" in sample:  # the filter's and flat map's samples (written as ids)
                common.note_worker()
                return {"id": int(sample["id"])}
            tokens = np.asarray(sample["tokens"], np.int32)
            if self.packed:
                common.note_worker()
                return {"tokens": tokens}
            example = common.to_example(tokens)
            shard, _ = self.spanner[idx]
            offset = common.B_OFFSET if self.stream_per_shard[shard] == 1 else 0
            return {"id": example["id"] + offset}

    return Records


class MosaicStreaming(Column):
    name = "mosaic-streaming"
    packages = ("mosaicml-streaming", "torch", "numpy")
    environment = ENVIRONMENT

    def missing(self) -> str | None:
        try:
            importlib.metadata.version("mosaicml-streaming")
        except importlib.metadata.PackageNotFoundError:
            return HERE_WHY
        return None

    def unsupported(self, scenario: str) -> str | None:
        return ELASTIC if scenario == "elastic" else None

    def fmt(self, scenario: str) -> str:
        return {"packing": "mds_packed", "filter": "mds_filter", "flat_map": "mds_flat_map"}.get(scenario, "mds")

    def open(self, ctx: Any, state: Any) -> Any:
        streaming()
        from streaming.base.util import clean_stale_shared_memory

        if ctx.host == 0:
            # MosaicML's remedy for shared memory a killed run left (the sigkill row's
            # processes): once, before any dataset is built. Only one process of the
            # matrix runs at a time, so no live run's memory is taken.
            clean_stale_shared_memory()
        # A node each: MosaicML reads the rank from the launcher's variables.
        host = OnHost({"WORLD_SIZE": str(ctx.hosts), "RANK": str(ctx.host), "LOCAL_WORLD_SIZE": "1",
                       "LOCAL_RANK": "0"})
        with host:
            run = self._open(ctx, state[0] if isinstance(state, list) else state)
        return host.wrap(run) if ctx.hosts > 1 else run

    def _open(self, ctx: Any, state: Any) -> EpochRun:
        Stream, StreamingDataLoader = streaming().Stream, streaming().StreamingDataLoader
        records = _dataset_class()
        sc, sizes = ctx.scenario, ctx.sizes
        batch = sizes.packed_batch if sc == "packing" else sizes.batch
        if sc == "elastic":
            batch = common.elastic_batch(sizes, ctx.hosts)

        def cache(name: str) -> str:
            return tempfile.mkdtemp(prefix=f"cache-{name}-host{ctx.host}-", dir=ctx.workdir)

        options = {"batch_size": batch, "shuffle": True, "shuffle_seed": common.SEED}
        if sc == "mixture":
            streams = [Stream(remote=ctx.data["a"], local=cache("a"), proportion=0.3),
                       Stream(remote=ctx.data["b"], local=cache("b"), proportion=0.7)]
            ds = records(streams=streams, **options)
        else:
            ds = records(remote=ctx.data["a"], local=cache("a"), **options)
        ds.packed = sc == "packing"
        loader = StreamingDataLoader(ds, batch_size=batch, num_workers=ctx.workers)
        return EpochRun(loader, sc, ctx.epochs, state, ids=_ids)
