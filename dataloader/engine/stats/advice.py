"""Advice: rules over a ``stats()`` dict, each naming a cause and its remedy.

Every rule is a pure function of the dict (its totals and ``pipeline`` section), so the
same advice comes from a live iterator, from ``run`` and from a ``stats.json`` written
earlier. The rules, in the order they are reported:

* ``parquet_random_access``: a shuffled ``ParquetDataSource`` spends most of the work
  reading (each record decodes its row group): convert, or stream.
* ``array_record_groups``: shuffled ArrayRecord files written with a group size above 1
  (each record decodes its group): rewrite them with ``group_size=1``.
* ``io_wait``: the processes that compute units spend most of their time reading and
  little of it on the CPU: they wait on I/O; read ahead in threads or add workers. Not
  given when one of the two rules above names the reading's cause (pyarrow decodes in
  threads of its own, so Parquet reads look like waiting).
* ``parent_bound``: this process spends more CPU per unit handing out tasks and
  receiving results than the workers need to compute them: fewer workers, bigger units.
* ``shm_too_small``: results came through pipes, not shared memory.
* ``step_starved``: the training step behind the device feed waited for data.

Where Ray actors compute the units (``pipeline["executor"]["kind"] == "ray"``), the
advice to use more or fewer of them names ``RayExecutor(num_workers=...)`` (and
``scale``), not ``worker_count``, and is not capped by this container: the actors run on
the cluster's CPUs. Advice to use more workers never goes past what the process's container allows: the
``container`` entry of the ``pipeline`` section (the CPUs, from the affinity and the CPU
quota, and the memory limit; :mod:`~dataloader.engine.pool.autoscale.limits`) caps the
count advised, and where the count is already there the advice names the limit and
says to make the work cheaper or give the container more.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from dataloader.engine.stats.shape import MAIN

MIN_UNITS = 8  # rules about rates need at least this many units to judge


class Advice(NamedTuple):
    """One piece of advice: which rule, what was measured, what to do."""

    rule: str
    cause: str
    remedy: str

    def __str__(self) -> str:
        return f"{self.cause}. {self.remedy}."


def _work(stats: dict[str, Any]) -> float:
    """Seconds of work on the units (reading and operations), wherever computed."""
    skip = ("transport", "host_to_device")
    return sum(s for name, s in stats["stage_seconds"].items() if name not in skip)


def _read_share(stats: dict[str, Any]) -> float:
    work = _work(stats)
    return stats["stage_seconds"].get("read", 0.0) / work if work > 0 else 0.0


def _container(stats: dict[str, Any]) -> dict[str, Any]:
    """The container's limits (an empty dict for a stats.json written before they were)."""
    return stats["pipeline"].get("container") or {}


def _cpus_words(container: dict[str, Any]) -> str:
    """``"4 CPUs"``, or ``"2 CPUs (cpu.max allows 1.5)"`` where a quota sets it."""
    cpus = container["cpus"]
    plural = "s" if cpus != 1 else ""
    if container.get("cpu_limit"):
        return f"{cpus} CPU{plural} ({container['cpu_limit']} allows {container['cpu_quota']:g})"
    return f"{cpus} CPU{plural}"


def _memory_words(container: dict[str, Any]) -> str:
    """``"; the container allows 1.4 GiB of memory (memory.max) for all of them"``, or ""."""
    if not container.get("memory_mb"):
        return ""
    mb = container["memory_mb"]
    size = f"{mb / 1024:.1f} GiB" if mb >= 1024 else f"{mb:.0f} MiB"
    return f"; the container allows {size} of memory ({container['memory_limit']}) for all of them"


def _ray(stats: dict[str, Any]) -> dict[str, Any] | None:
    """The ``executor`` entry when Ray actors compute the units (their count is set on
    the ``RayExecutor``, not by ``worker_count``, and the container's limits are this
    process's, not the cluster's), else None."""
    executor = stats["pipeline"].get("executor") or {}
    return executor if executor.get("kind") == "ray" else None


def _actors_words(ray: dict[str, Any]) -> str:
    """``"RayExecutor num_workers (now 2 actors, 1 more on this node (local_workers))"``."""
    local = ray.get("local_actors", 0)
    here = f", {local} more on this node (local_workers)" if local else ""
    return f"RayExecutor num_workers (now {ray.get('remote_actors', 0)} actors{here})"


def _pool(stats: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in stats["workers"].items() if k.rsplit("/", 1)[-1] != MAIN}


def parquet_random_access(stats: dict[str, Any]) -> Advice | None:
    pipeline, share = stats["pipeline"], _read_share(stats)
    if pipeline.get("source") != "ParquetDataSource" or not pipeline.get("shuffle") or share < 0.5:
        return None
    return Advice(
        "parquet_random_access",
        f"records are read from Parquet in a shuffled order: each one decodes its whole row "
        f"group, so reading took {share:.0%} of the work ({stats['records_per_s']:,.0f} records/s)",
        "convert the files once to ArrayRecord (python -m dataloader convert FILES "
        "--output=PREFIX) to keep the global shuffle, or stream them in order with "
        "dl.experimental.ParquetIterDataset (files shuffled, rows shuffled in a window)",
    )


def array_record_groups(stats: dict[str, Any]) -> Advice | None:
    pipeline = stats["pipeline"]
    group = pipeline.get("max_group_size") or 1
    if group <= 1 or not pipeline.get("shuffle"):
        return None
    return Advice(
        "array_record_groups",
        f"{pipeline.get('files_with_groups', 1)} ArrayRecord file(s) were written with "
        f"group_size={group}: every record read in a shuffled order decodes a group of up to "
        f"{group} records (reading took {_read_share(stats):.0%} of the work)",
        "rewrite them with group_size=1 (dl.write_array_record(path, records, group_size=1), "
        "or python -m dataloader convert ... --group_size=1 from the original files)",
    )


def io_wait(stats: dict[str, Any]) -> Advice | None:
    workers = _pool(stats) or stats["workers"]
    busy = sum(w["busy_s"] for w in workers.values())
    cpu = sum(w["cpu_s"] for w in workers.values())
    share = _read_share(stats)
    if stats["units"] < MIN_UNITS or busy <= 0 or share < 0.5 or cpu / busy > 0.5:
        return None
    if parquet_random_access(stats) or array_record_groups(stats):
        return None
    who = "the workers" if _pool(stats) else "this process"
    count = stats["pipeline"].get("worker_count", 0)
    more = f"worker_count={max(2, 2 * count)}" if isinstance(count, int) else "a larger worker_count"
    if (ray := _ray(stats)) is not None:
        who, more = "the Ray actors", f"a larger {_actors_words(ray)}"
    # Waiting workers may outnumber the CPUs (that is the point), but each costs memory.
    remedy = (
        f"read ahead in threads: ReadOptions(num_threads=8, prefetch_buffer_size=500) "
        f"(worker_count=0), or use more workers than cores ({more}) so their waits "
        f"overlap{_memory_words(_container(stats))}"
    )
    return Advice(
        "io_wait",
        f"{who} spent {share:.0%} of their time reading but used the CPU only "
        f"{cpu / busy:.0%} of the time they were computing: they wait on I/O",
        remedy,
    )


def parent_bound(stats: dict[str, Any]) -> Advice | None:
    pool = _pool(stats)
    units = sum(w["units"] for w in pool.values())
    if not pool or units < MIN_UNITS or stats["wait_share"] < 0.2:
        return None
    main = stats["workers"].get(MAIN, {"cpu_s": 0.0})
    parent = max(0.0, stats["fetch_cpu_s"] - main["cpu_s"]) / units  # warm-start units excluded
    compute = sum(w["busy_s"] for w in pool.values()) / units
    count = len(pool)
    if parent * count < compute:
        return None
    busy = sum(w.get("busy_share", 0.0) for w in pool.values()) / count
    fewer = "use fewer workers (worker_count=0 computes in this process without that cost)"
    if _ray(stats) is not None:  # receiving from Ray's object store is the cost here
        fewer = "use fewer actors (RayExecutor num_workers; worker_count=0 has no such cost)"
    return Advice(
        "parent_bound",
        f"this process spent {parent * 1e3:.2f} ms of CPU per unit handing out tasks and "
        f"receiving results, while a worker computed a unit in {compute * 1e3:.2f} ms: with "
        f"{count} workers this process, not the workers, sets the pace (workers busy {busy:.0%})",
        f"{fewer} or bigger units: a larger batch size, or ReadOptions(unit_size=...) when "
        "a filter or flat map comes before the batch",
    )


def shm_too_small(stats: dict[str, Any]) -> Advice | None:
    pool_units = sum(w["units"] for w in _pool(stats).values())
    piped = stats["pipe_units"]
    if not piped or piped * 2 < pool_units:
        return None
    free = stats["pipeline"].get("shm_free_mb")
    room = f" ({free:,.0f} MiB free)" if free is not None else ""
    return Advice(
        "shm_too_small",
        f"{piped:,} of {pool_units:,} results came through pipes instead of shared memory "
        f"(one more copy each): result blocks could not be had (no memfd_create, or too "
        f"little memory left{room})",
        "give the job more memory (the container's limit), or lower worker_count or "
        "worker_buffer_size",
    )


def step_starved(stats: dict[str, Any]) -> Advice | None:
    if "device_feed" not in stats["pipeline"] or stats["wait_share"] < 0.1:
        return None
    count = stats["pipeline"].get("worker_count", 0)
    container = _container(stats)
    cpus = container.get("cpus")
    memory = _memory_words(container)
    if (ray := _ray(stats)) is not None:
        # The actors' CPUs are the cluster's: this container's limits do not cap them.
        fix = (
            f"raise {_actors_words(ray)}, with executor.scale(n) while it runs or when "
            f"building it, and give the cluster nodes with the CPUs and resources the "
            f"actors ask for; or make the operations cheaper"
        )
    elif count == "auto":
        fix = (
            "the auto-sized pool did not keep up: raise its ceiling (AutoWorkers(max_workers=...)) "
            "or its memory budget (min_free_memory), or make the operations cheaper"
        )
        if cpus is not None and (container.get("cpu_limit") or memory):
            fix = (
                f"the auto-sized pool did not keep up; it stops at the {_cpus_words(container)} "
                f"this container allows{memory}: make the operations cheaper, or give the "
                f"container more CPUs or memory"
            )
    elif cpus is not None and isinstance(count, int) and count >= cpus:
        fix = (
            f"worker_count={count} already uses the {_cpus_words(container)} this process may "
            f"use{memory}: more workers would share the same CPUs; make the operations cheaper, "
            f"or give the container (or the process's affinity) more CPUs"
        )
    elif cpus is not None:
        fix = (
            f"raise worker_count (now {count}) up to {cpus}, the {_cpus_words(container)} this "
            f"process may use{memory}, or let the loader pick it: worker_count=\"auto\""
        )
    else:
        fix = f"raise worker_count (now {count}), or let the loader pick it: worker_count=\"auto\""
    return Advice(
        "step_starved",
        f"the training step waited for data {stats['wait_share']:.0%} of the time "
        f"({stats['wait_s']:.2f} s in next() of the device feed)",
        fix,
    )


RULES: tuple[Callable[[dict[str, Any]], Advice | None], ...] = (
    parquet_random_access, array_record_groups, io_wait, parent_bound, shm_too_small, step_starved,
)


def advise(stats: dict[str, Any]) -> list[Advice]:
    """The advice that applies to a ``stats()`` dict (or a ``stats.json`` read back).

    Example:
        >>> import dataloader as dl
        >>> it = iter(dl.DataLoader(dl.RangeDataSource(8), dl.SequentialSampler(8), [dl.Batch(4)]))
        >>> _ = list(it)
        >>> dl.advise(it.stats())
        []
    """
    return [advice for rule in RULES if (advice := rule(stats)) is not None]
