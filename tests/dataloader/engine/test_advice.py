"""Each advice rule, on a pipeline built to trigger it (and one that must not).

The rules about worker processes (parent-bound pool, /dev/shm too small) are in
tests/integration/test_stats_workers.py; the starved step in tests/dataloader/device.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import dataloader as dl
from tests.dataloader.pipelines import SlowStorage


def rules(stats):
    return [advice.rule for advice in dl.advise(stats)]


def run(loader, batches=None):
    it = iter(loader)
    for i, _ in enumerate(it):
        if batches is not None and i + 1 >= batches:
            break
    stats = it.stats()
    it.close()
    return stats


def parquet_loader(tmp_path, shuffle):
    path = tmp_path / "rows.parquet"
    n = 20_000
    pq.write_table(pa.table({"id": np.arange(n), "text": [f"row {i} " * 8 for i in range(n)]}), path,
                   row_group_size=500)
    source = dl.ParquetDataSource(str(path))
    sampler = dl.IndexSampler(n, shuffle=shuffle, seed=0, num_epochs=1)
    return dl.DataLoader(source, sampler, [dl.MapTransform(lambda row: row["id"]), dl.Batch(32)])


def test_random_access_on_parquet_says_convert_or_stream(tmp_path):
    stats = run(parquet_loader(tmp_path, shuffle=True), batches=12)
    assert rules(stats) == ["parquet_random_access"]
    text = str(dl.advise(stats)[0])
    assert "each one decodes its whole row group" in text
    assert "python -m dataloader convert" in text and "dl.experimental.ParquetIterDataset" in text


def test_parquet_read_in_order_gets_no_such_advice(tmp_path):
    stats = run(parquet_loader(tmp_path, shuffle=False), batches=12)
    assert "parquet_random_access" not in rules(stats)


def group_loader(tmp_path, group_size):
    path = tmp_path / f"g{group_size}.array_record"
    dl.write_array_record(path, [bytes(100) for _ in range(2000)], group_size=group_size)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the source warns about the group size too
        source = dl.ArrayRecordDataSource(str(path))
    return dl.DataLoader(source, dl.IndexSampler(2000, shuffle=True, seed=0, num_epochs=1), [dl.Batch(50)])


def test_array_record_files_with_groups_say_rewrite_with_group_size_1(tmp_path):
    stats = run(group_loader(tmp_path, 64))
    assert stats["pipeline"]["max_group_size"] == 64
    assert "array_record_groups" in rules(stats)
    advice = next(a for a in dl.advise(stats) if a.rule == "array_record_groups")
    assert "written with group_size=64" in advice.cause and "group_size=1" in advice.remedy
    assert "array_record_groups" not in rules(run(group_loader(tmp_path, 1)))


def burn(x):
    return sum(i * i for i in range(2000)) + x


def test_reads_that_wait_on_io_say_read_ahead_in_threads():
    loader = dl.DataLoader(SlowStorage(400, 0.003), dl.SequentialSampler(400), [dl.Batch(8)])
    stats = run(loader)
    assert rules(stats) == ["io_wait"]
    advice = dl.advise(stats)[0]
    assert advice.cause.startswith("this process spent")
    assert "ReadOptions(num_threads=8, prefetch_buffer_size=500)" in advice.remedy


def test_a_cpu_bound_pipeline_does_not_look_like_io():
    loader = dl.DataLoader(dl.RangeDataSource(200), dl.SequentialSampler(200), [dl.MapTransform(burn), dl.Batch(8)])
    assert "io_wait" not in rules(run(loader))


def test_advice_is_a_function_of_the_stats_so_a_stats_json_gives_it_back(tmp_path):
    stats = run(dl.DataLoader(SlowStorage(200, 0.003), dl.SequentialSampler(200), [dl.Batch(8)]))
    again = json.loads(json.dumps(stats))
    assert dl.advise(again) == dl.advise(stats) != []


def test_the_pipeline_section_says_what_the_container_allows():
    stats = run(dl.DataLoader(dl.RangeDataSource(16), dl.SequentialSampler(16), [dl.Batch(8)]))
    container = stats["pipeline"]["container"]
    assert set(container) == {"cpus", "cpu_quota", "cpu_limit", "memory_mb", "memory_limit"}
    assert container["cpus"] >= 1


def starved(worker_count, container):
    """The step_starved advice of a stats dict whose step waited half the time."""
    stats = run(dl.DataLoader(dl.RangeDataSource(16), dl.SequentialSampler(16), [dl.Batch(8)]))
    stats["pipeline"].update(device_feed={"cpu_buffer_size": 2, "device_buffer_size": 3},
                             worker_count=worker_count, container=container)
    stats.update(wait_share=0.5, wait_s=3.0)
    return next(a for a in dl.advise(stats) if a.rule == "step_starved")


QUOTA = {"cpus": 2, "cpu_quota": 1.5, "cpu_limit": "cpu.max", "memory_mb": 1433.6, "memory_limit": "memory.max"}


def test_starved_steps_never_get_advice_above_the_containers_cpus():
    advice = starved(2, QUOTA)
    assert "raise worker_count" not in advice.remedy
    assert advice.remedy.startswith("worker_count=2 already uses the 2 CPUs (cpu.max allows 1.5) this process may use; "
                                    "the container allows 1.4 GiB of memory (memory.max) for all of them")
    assert "give the container (or the process's affinity) more CPUs" in advice.remedy
    below = starved(1, QUOTA).remedy
    assert below.startswith("raise worker_count (now 1) up to 2, the 2 CPUs (cpu.max allows 1.5) this process may use")
    auto = starved("auto", QUOTA).remedy
    assert "it stops at the 2 CPUs (cpu.max allows 1.5) this container allows" in auto
    assert "raise its ceiling" not in auto


def test_without_container_limits_the_advice_names_the_cpus_only():
    free = {"cpus": 8, "cpu_quota": None, "cpu_limit": None, "memory_mb": None, "memory_limit": None}
    assert starved(2, free).remedy == 'raise worker_count (now 2) up to 8, the 8 CPUs this process may use, ' \
                                      'or let the loader pick it: worker_count="auto"'
    assert "raise its ceiling (AutoWorkers(max_workers=...))" in starved("auto", free).remedy
    # a stats.json written before the container entry existed
    assert starved(2, None).remedy == 'raise worker_count (now 2), or let the loader pick it: worker_count="auto"'
