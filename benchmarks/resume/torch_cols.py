"""PyTorch's ``DataLoader`` as torchdata's ``StatefulDataLoader`` (its drop-in
replacement with ``state_dict()`` / ``load_state_dict()``).

Map-style scenarios read a map-style ``Dataset`` of the Parquet files, shuffled by the
``RandomSampler`` that ``shuffle=True`` makes from a seeded ``generator`` (torchdata
patches it to save its state). Filter, flat map and packing need a stream: an
``IterableDataset`` written as torch documents (each worker takes its share through
``get_worker_info()``); without a ``state_dict`` of its own, StatefulDataLoader
"naively fast-forwards" it by the number of items each worker yielded (torchdata's
README). The mixture is ``WeightedRandomSampler`` over a ``ConcatDataset``. Epochs are
the user's loop, and the epoch number is saved beside the loader's state, as a training
loop's checkpoint holds it.
"""

from __future__ import annotations

import glob
import pickle
from typing import Any

import numpy as np

from resume import common
from resume.base import Column

ELASTIC = (
    "torchdata's docs: StatefulDataLoader \"handles aggregation and distribution of state "
    "across multiprocess workers (but not across ranks)\"; a state is one rank's"
)


def read_parquet(pattern: str) -> list[np.ndarray]:
    import pyarrow.parquet as pq

    rows: list[np.ndarray] = []
    for path in sorted(glob.glob(pattern)):
        rows += [np.asarray(t, np.int32) for t in pq.read_table(path).column("tokens").to_pylist()]
    return rows


def pack_rows(examples: Any, row: int = common.ROW):
    """A greedy packer, as a user writes one: documents in order into rows of ``row``
    tokens; a document that does not fit closes the row (padding is 0)."""
    current: list[np.ndarray] = []
    used = 0
    for e in examples:
        tokens = e["tokens"]
        if used + len(tokens) > row and current:
            yield {"tokens": np.concatenate([*current, np.zeros(row - used, np.int32)])}
            current, used = [], 0
        current.append(tokens)
        used += len(tokens)
    if current:
        yield {"tokens": np.concatenate([*current, np.zeros(row - used, np.int32)])}


def _torch_classes() -> dict[str, Any]:
    import torch
    from torch.utils.data import Dataset, IterableDataset, get_worker_info

    class Records(Dataset):
        """Map-style: record ``i`` decoded, its id (or +B_OFFSET for the mixture's B)."""

        def __init__(self, pattern: str, offset: int = 0) -> None:
            self.rows, self.offset = read_parquet(pattern), offset

        def __len__(self) -> int:
            return len(self.rows)

        def __getitem__(self, i: int) -> dict:
            return {"id": common.to_example(self.rows[i])["id"] + self.offset}

    class Stream(IterableDataset):
        """The shuffled records through the scenario's operation, each worker a share."""

        def __init__(self, pattern: str, scenario: str) -> None:
            self.rows, self.scenario = read_parquet(pattern), scenario

        def __iter__(self):
            info = get_worker_info()
            wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
            order = np.random.default_rng(common.SEED).permutation(len(self.rows))[wid::nw]
            examples = (common.to_example(self.rows[k]) for k in order)
            if self.scenario == "filter":
                examples = (e for e in examples if common.keep(e))
            elif self.scenario == "flat_map":
                examples = (out for e in examples for out in common.fan_out(e))
            if self.scenario == "packing":
                yield from pack_rows(examples)
            else:
                yield from ({"id": e["id"]} for e in examples)

    return {"torch": torch, "Records": Records, "Stream": Stream}


def ids_of(scenario: str, batch: Any) -> list[int]:
    if scenario == "packing":
        return common.token_ids(batch["tokens"].numpy())
    return [int(x) for x in batch["id"]]


class EpochRun:
    """Epochs as a training loop runs them; the checkpoint is (epoch, loader state)."""

    def __init__(self, loader: Any, scenario: str, epochs: int, state: bytes | None, before_epoch: Any = None,
                 ids: Any = None) -> None:
        self.loader, self.scenario, self.epochs = loader, scenario, epochs
        self.before_epoch = before_epoch or (lambda epoch: None)
        self.ids = ids or ids_of
        self.epoch = 0
        if state is not None:
            saved = pickle.loads(state)
            self.epoch = saved["epoch"]
            self.before_epoch(self.epoch)
            loader.load_state_dict(saved["loader"])
            self._restored = True
        else:
            self._restored = False

    def __iter__(self):
        for epoch in range(self.epoch, self.epochs):
            self.epoch = epoch
            if not self._restored:
                self.before_epoch(epoch)
            self._restored = False
            for batch in self.loader:
                yield self.ids(self.scenario, batch)

    def save(self) -> bytes:
        return pickle.dumps({"epoch": self.epoch, "loader": self.loader.state_dict()})

    def close(self) -> None:
        self.loader = None


class OneRankColumn(Column):
    """A column over the Parquet files whose state is one rank's (no elastic restore)."""

    elastic = ELASTIC

    def unsupported(self, scenario: str) -> str | None:
        return self.elastic if scenario == "elastic" else None

    def fmt(self, scenario: str) -> str:
        return "parquet"


class StatefulLoader(OneRankColumn):
    name = "torchdata"
    packages = ("torch", "torchdata")

    def open(self, ctx: Any, state: Any) -> EpochRun:
        from torchdata.stateful_dataloader import StatefulDataLoader

        c = _torch_classes()
        torch = c["torch"]
        sc, sizes = ctx.scenario, ctx.sizes
        generator = torch.Generator().manual_seed(common.SEED)
        common_args = {"num_workers": ctx.workers}
        if sc in ("filter", "flat_map", "packing"):
            batch = sizes.packed_batch if sc == "packing" else sizes.batch
            loader = StatefulDataLoader(c["Stream"](ctx.data["a"], sc), batch_size=batch, **common_args)
        elif sc == "mixture":
            from torch.utils.data import ConcatDataset, WeightedRandomSampler

            a, b = c["Records"](ctx.data["a"]), c["Records"](ctx.data["b"], common.B_OFFSET)
            weights = [0.3 / len(a)] * len(a) + [0.7 / len(b)] * len(b)
            sampler = WeightedRandomSampler(weights, num_samples=len(a), replacement=True, generator=generator)
            loader = StatefulDataLoader(ConcatDataset([a, b]), batch_size=sizes.batch, sampler=sampler, **common_args)
        else:
            loader = StatefulDataLoader(c["Records"](ctx.data["a"]), batch_size=sizes.batch, shuffle=True,
                                        generator=generator, **common_args)
        return EpochRun(loader, sc, ctx.epochs, state)
