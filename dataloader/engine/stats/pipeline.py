"""What a pipeline is, as ``stats()["pipeline"]`` says it: what the advice rules read.

Computed once, when a loader is made, from its plan and settings (values, never the
loader); plain JSON values only, so a ``stats.json`` file carries everything the rules
need.
"""

from __future__ import annotations

from typing import Any

from dataloader.engine.pool.autoscale.limits import read_limits


def describe_pipeline(
    plan: Any,
    *,
    worker_count: Any,
    worker_buffer_size: int,
    read_options: Any,
    executor: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The source, its files' group sizes, the sampler's order, the operations, workers.

    Args:
        plan: the loader's :class:`~dataloader.engine.plan.Plan`.
        worker_count: the loader's worker count (an int, or an ``AutoWorkers``).
        worker_buffer_size: units in flight per worker.
        read_options: the in-process read-ahead (a ``ReadOptions``).
        executor: what computes the units when it is neither this process nor the
            pool, as the executor describes itself (plain JSON values, with a
            ``"kind"``; ``RayExecutor.describe()``: ``{"kind": "ray", "actors": ...,
            "remote_actors": ..., "local_actors": ...}``, counts as the loader was
            built). None: ``{"kind": "pool"}`` with workers, else ``{"kind":
            "in_process"}``.
    """
    source, sampler = plan.source, plan.sampler
    groups = [g for g in getattr(source, "group_sizes", ()) or () if g is not None]
    return {
        "source": type(source).__name__,
        "num_records": int(sampler.num_records),
        "shuffle": bool(sampler.shuffle),
        "max_group_size": max(groups) if groups else None,
        "files_with_groups": sum(1 for g in groups if g > 1),
        "operations": list(plan.operation_names),
        "batch_size": plan.batch.batch_size if plan.batch is not None else None,
        "unit_size": plan.unit_size,
        "layout": plan.layout,
        # "auto": the pool sizes itself (worker_count="auto"); the count varies.
        "worker_count": worker_count if isinstance(worker_count, int) else "auto",
        # Where units are computed: the advice names the setting that adds workers there.
        "executor": dict(executor) if executor is not None
        else {"kind": "pool" if worker_count else "in_process"},
        "worker_buffer_size": worker_buffer_size,
        "read_threads": read_options.num_threads,
        "read_prefetch": read_options.prefetch_buffer_size,
        # the CPUs and memory a container allows (the advice never asks for more)
        "container": read_limits().summary(),
    }
