"""Pipelines and a host simulator for the elastic-restore tests and the benchmark table.

Every pipeline's outputs carry record ids (the source's integers, times 10 plus the
rank after a flat map), so a run across host changes can be checked for records used
exactly once. Functions live at module level so worker processes can import them.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import dataloader as dl
from dataloader.iterator import elastic_iterator

N = 103  # records: a prime, so no host count divides the stream

# Host changes: phases of (host count, steps per host; None: to the end).
CHANGES = {
    "1->2": [(1, 3), (2, None)],
    "2->3": [(2, 3), (3, None)],
    "3->1": [(3, 2), (1, None)],
    "1->2->3->1": [(1, 2), (2, 2), (3, 1), (1, None)],
    "2->3->1 at once": [(2, 0), (3, 1), (1, None)],
}
# The changes issue 33 names for every restore case it fixed, with 0 and 2 workers.
ISSUE_CHANGES = ["1->2", "2->3", "3->1", "1->2->3->1"]


def keep(x: int) -> bool:
    return x % 3 != 0


def keep_id(x: int) -> bool:
    return (x // 10) % 3 != 0


def fan_out(x: int) -> list[int]:
    return [x * 10 + k for k in range(x % 4)]  # 0 to 3 outputs a record


def times_ten(x: int) -> int:
    return x * 10


def same(x: Any) -> Any:
    return x


def as_x(x: int) -> dict[str, np.ndarray]:
    return {"x": np.int64(x)}


def as_tokens(x: int) -> dict[str, np.ndarray]:
    return {"tokens": np.full(1 + x % 7, x + 1, dtype=np.int64)}


_PARQUET: list[str] = []


def parquet_path() -> str:
    """A Parquet file of the ids 0..N-1 (column ``id``, row groups of 10), made once."""
    if not _PARQUET:
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = os.path.join(tempfile.mkdtemp(prefix="granary_elastic_"), "ids.parquet")
        pq.write_table(pa.table({"id": np.arange(N, dtype=np.int64)}), path, row_group_size=10)
        _PARQUET.append(path)
    return _PARQUET[0]


def parquet_id(row: dict[str, Any]) -> int:
    return int(row["id"]) * 10


def _source_and_sampler(mixture: bool, window: bool, parquet: bool = False) -> tuple[Any, Any, list[Any]]:
    if parquet:
        from dataloader.dataset.streams.lowering import stream_form

        form = stream_form(dl.experimental.ParquetIterDataset(parquet_path()))
        assert form is not None
        compiled = form.dataset._compiled
        return compiled.source, compiled.sampler, [*compiled.operations, dl.MapTransform(parquet_id)]
    if mixture:
        ds = dl.MapDataset.mix([dl.MapDataset.range(0, 60), dl.MapDataset.range(60, N)], [2, 1])
        compiled = ds._compiled
        return compiled.source, compiled.sampler, list(compiled.operations)
    if window:
        ds = dl.experimental.WindowShuffleMapDataset(dl.MapDataset.range(N), window_size=16, seed=5)
        compiled = ds._compiled
        return compiled.source, compiled.sampler, list(compiled.operations)
    return dl.RangeDataSource(N), dl.IndexSampler(N, shuffle=True, seed=3, num_epochs=1), []


def as_long_tokens(x: int) -> dict[str, np.ndarray]:
    return {"tokens": np.full(1 + x % 30, x + 1, dtype=np.int64)}  # up to 30: cut into 3 rows of 12


def _window() -> Any:
    from dataloader.dataset.transformations.window_shuffle import WindowShuffle

    return WindowShuffle(window_size=7, seed=11)


def _pack(kind: str) -> Any:
    # Cut elements: rows in row order (first-fit) and shuffled (best-fit, the default), so
    # a cut element's pieces come out in either order.
    if kind == "first_fit, cut":
        return dl.FirstFitPack({"tokens": 12}, num_packing_bins=3, shuffle_bins=False)
    if kind == "best_fit, cut":
        return dl.BestFitPack({"tokens": 12}, num_packing_bins=4)
    if kind == "first_fit":
        return dl.FirstFitPack({"tokens": 12}, num_packing_bins=3)
    if kind == "best_fit":
        return dl.BestFitPack({"tokens": 12}, num_packing_bins=3)
    return dl.ConcatThenSplit({"tokens": 12})


# name -> (operations, how to read record ids from one output)
PIPELINES: dict[str, tuple[Callable[[], list[Any]], str]] = {
    "plain": (lambda: [dl.MapTransform(times_ten), dl.Batch(4)], "batch"),
    "filter": (lambda: [dl.FilterTransform(keep), dl.MapTransform(times_ten), dl.Batch(4)], "batch"),
    "flat map": (lambda: [dl.FlatMapTransform(fan_out, max_fan_out=3), dl.Batch(4)], "batch"),
    "flat map, unbatched": (lambda: [dl.FlatMapTransform(fan_out, max_fan_out=3)], "element"),
    "mixture": (lambda: [dl.FilterTransform(keep), dl.MapTransform(times_ten), dl.Batch(4)], "batch"),
    "Parquet stream": (lambda: [dl.FilterTransform(keep_id), dl.Batch(4)], "batch"),
    "window shuffle": (lambda: [dl.FilterTransform(keep), dl.MapTransform(times_ten), dl.Batch(4)], "batch"),
    "first-fit": (lambda: [dl.FilterTransform(keep), dl.MapTransform(as_tokens), _pack("first_fit")], "row"),
    "best-fit": (lambda: [dl.FilterTransform(keep), dl.MapTransform(as_tokens), _pack("best_fit")], "row"),
    "concat-then-split": (lambda: [dl.FilterTransform(keep), dl.MapTransform(as_tokens), _pack("concat")], "tokens"),
    "first-fit, cut": (lambda: [dl.FilterTransform(keep), dl.MapTransform(as_long_tokens), _pack("first_fit, cut")], "tokens"),
    "best-fit, cut": (lambda: [dl.FilterTransform(keep), dl.MapTransform(as_long_tokens), _pack("best_fit, cut")], "tokens"),
    # WindowShuffleIterDataset's stage over the engine's stream (the iterator-level one,
    # one window in memory), alone and under a packer.
    "stream window shuffle": (
        lambda: [dl.FilterTransform(keep), dl.MapTransform(times_ten), _window(), dl.Batch(4)], "batch"
    ),
    "stream window shuffle, first-fit": (
        lambda: [dl.FilterTransform(keep), dl.MapTransform(as_tokens), _window(), _pack("first_fit")], "row"
    ),
    "stream window shuffle, map, first-fit": (
        lambda: [dl.FilterTransform(keep), _window(), dl.MapTransform(as_tokens), _pack("first_fit")], "row"
    ),
    # A map and a filter after the packer: the loader's pooled stage under workers.
    "first-fit, map, filter": (
        lambda: [dl.FilterTransform(keep), dl.MapTransform(as_tokens), _pack("first_fit"),
                 dl.MapTransform(same_row), dl.FilterTransform(keep_row)], "row"
    ),
    # A packer over a packer's rows (each inner row whole in an outer one): ids per token.
    "first-fit, first-fit": (
        lambda: [dl.FilterTransform(keep), dl.MapTransform(as_tokens), _pack("first_fit"),
                 dl.FirstFitPack({"tokens": 24}, num_packing_bins=2)], "tokens"
    ),
    "flat map, first-fit": (
        lambda: [dl.FlatMapTransform(fan_out, max_fan_out=3), dl.MapTransform(as_tokens), _pack("first_fit")], "row"
    ),
    "flat map, concat-then-split": (
        lambda: [dl.FlatMapTransform(fan_out, max_fan_out=3), dl.MapTransform(as_tokens), _pack("concat")], "tokens"
    ),
    # end="pad" (make_loader passes it for these names): every host the same number of
    # steps, the last ones padded and masked; on one host the sampler has NoSharding.
    "end pad": (lambda: [dl.MapTransform(as_x), dl.Batch(4)], "masked"),
}


def same_row(row: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: np.asarray(v).copy() for k, v in row.items()}


def keep_row(row: dict[str, np.ndarray]) -> bool:
    # Keeps every row: which records a row filter drops depends on how they were packed,
    # and the new hosts pack the open bins' records into other rows (the records stay).
    return bool(np.asarray(row["tokens_segment_ids"]).max() > 0)


def keep_tokens(element: dict[str, np.ndarray]) -> bool:
    return keep(int(np.asarray(element["tokens"])[0]) - 1)


def _stream(shard: int, count: int) -> Any:
    return dl.MapDataset.range(N).seed(3).shuffle().to_iter_dataset(shard_options=dl.ShardOptions(shard, count))


def _first_fit(parent: Any, length: int = 12) -> Any:
    return dl.experimental.FirstFitPackIterDataset(parent, length_struct={"tokens": length}, num_packing_bins=3)


def _shuffled(parent: Any) -> Any:
    return dl.experimental.WindowShuffleIterDataset(parent, window_size=7, seed=11)


# Datasets whose element-wise calls after an iterator-level stage (a packer, a window
# shuffle) run on the worker pool under mp_prefetch (the pooled stage): name ->
# (the dataset of host ``shard`` of ``count``, how to read record ids). Restored with
# ``iterator.set_state(every old host's states)``.
DATASETS: dict[str, tuple[Callable[[int, int], Any], str]] = {
    "pooled map over first-fit": (
        lambda h, c: _first_fit(_stream(h, c).filter(keep).map(as_tokens)).map(same_row), "row"),
    "pooled filter over first-fit": (
        lambda h, c: _first_fit(_stream(h, c).filter(keep).map(as_tokens)).filter(keep_row), "row"),
    "first-fit over pooled map": (
        lambda h, c: _first_fit(_shuffled(_stream(h, c).filter(keep)).map(as_tokens)), "row"),
    "first-fit over pooled filter": (
        lambda h, c: _first_fit(_shuffled(_stream(h, c).map(as_tokens)).filter(keep_tokens)), "row"),
    # A packer over a packer (rows of 24 from rows of 12: each inner row whole), directly
    # and through a pooled map: the outer rows name the inner rows' records (ids counted
    # per token: the outer rows' segments are inner rows).
    "first-fit over first-fit": (
        lambda h, c: _first_fit(_first_fit(_stream(h, c).filter(keep).map(as_tokens)), 24), "tokens"),
    "first-fit over pooled map over first-fit": (
        lambda h, c: _first_fit(_first_fit(_stream(h, c).filter(keep).map(as_tokens)).map(same_row), 24), "tokens"),
    # A batch (in the consumer's process) over a window shuffle or a packer, directly and
    # with a pooled map between.
    "batch over window shuffle": (lambda h, c: _shuffled(_stream(h, c).filter(keep)).batch(4), "batch"),
    "batch over pooled map over window shuffle": (
        lambda h, c: _shuffled(_stream(h, c).filter(keep)).map(same).batch(4), "batch"),
    "batch over first-fit": (lambda h, c: _first_fit(_stream(h, c).filter(keep).map(as_tokens)).batch(2), "rows"),
    "batch over pooled map over first-fit": (
        lambda h, c: _first_fit(_stream(h, c).filter(keep).map(as_tokens)).map(same_row).batch(2), "rows"),
}


def make_dataset_iterator(name: str, shard: int, count: int, workers: int = 0) -> Any:
    """The dataset ``name`` as host ``shard`` of ``count``, its element-wise calls after
    an iterator-level stage on ``workers`` worker processes (0: the pooled stage in this
    process)."""
    ds = DATASETS[name][0](shard, count)
    return iter(ds.mp_prefetch(dl.MultiprocessingOptions(num_workers=workers)))


def _kind(name: str) -> str:
    return DATASETS[name][1] if name in DATASETS else PIPELINES[name][1]


def make_loader(name: str, shard: int, count: int, workers: int = 0) -> dl.DataLoader:
    """The pipeline ``name`` as host ``shard`` of ``count``."""
    source, sampler, head = _source_and_sampler(name == "mixture", name == "window shuffle", name == "Parquet stream")
    ops, _ = PIPELINES[name]
    return dl.DataLoader(source, sampler, [*head, *ops()], worker_count=workers,
                         shard_options=dl.ShardOptions(shard, count), end="pad" if "end pad" in name else None)


def record_ids(name: str, output: Any) -> list[int]:
    """The record ids one output holds (for concat-then-split: one id per token)."""
    kind = _kind(name)
    if kind in ("batch", "element"):
        return np.asarray(output).reshape(-1).tolist()
    if kind == "masked":  # end="pad": the real rows
        return np.asarray(output["x"])[np.asarray(output["mask"])].tolist()
    if kind == "rows":  # a batch of packed rows
        rows = {k: np.asarray(v) for k, v in output.items()}
        return [i for r in range(len(rows["tokens"])) for i in record_ids("first-fit", {k: v[r] for k, v in rows.items()})]
    tokens, segments = np.asarray(output["tokens"]), np.asarray(output["tokens_segment_ids"])
    if kind == "tokens":
        return [int(t) - 1 for t in tokens[(segments > 0) & (tokens > 0)]]  # not an inner row's padding
    return [int(tokens[segments == s][0]) - 1 for s in np.unique(segments[segments > 0])]


def reference(name: str) -> list[int]:
    """Every record id of one uninterrupted run on one host, sorted."""
    if name in DATASETS:
        return run(name, [(1, None)])
    return sorted(i for out in make_loader(name, 0, 1) for i in record_ids(name, out))


def run(name: str, phases: Sequence[tuple[int, int | None]], workers: int = 0) -> list[int]:
    """Runs ``name`` through ``phases`` of ``(host count, steps per host)``, each phase
    restored elastically from every state of the one before (``None`` steps: to the
    end), and returns every record id used, sorted."""
    used: list[int] = []
    states: list[Any] | None = None
    for count, steps in phases:
        iterators = []
        for h in range(count):
            if name in DATASETS:
                it = make_dataset_iterator(name, h, count, workers)
                if states is not None:
                    it.set_state(states)
                iterators.append(it)
                continue
            loader = make_loader(name, h, count, workers)
            iterators.append(iter(loader) if states is None else elastic_iterator(loader, states))
        for it in iterators:
            taken = 0
            while steps is None or taken < steps:
                try:
                    out = next(it)
                except StopIteration:
                    break
                used += record_ids(name, out)
                taken += 1
        states = [it.get_state() for it in iterators]
        for it in iterators:
            it.close()
    return sorted(used)


def lost_and_repeated(name: str, phases: Sequence[tuple[int, int | None]], workers: int = 0) -> tuple[int, int]:
    """How many record ids of the reference run ``run`` lost, and how many it repeated."""
    want, got = reference(name), run(name, phases, workers)
    counts: dict[int, int] = {}
    for i in got:
        counts[i] = counts.get(i, 0) + 1
    expected: dict[int, int] = {}
    for i in want:
        expected[i] = expected.get(i, 0) + 1
    lost = sum(max(0, c - counts.get(i, 0)) for i, c in expected.items())
    repeated = sum(max(0, c - expected.get(i, 0)) for i, c in counts.items())
    return lost, repeated
