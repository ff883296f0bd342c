"""Process 0 lists ArrayRecord files in a store and reads their indices; the other
processes build their sources from what it posts in the runtime's key-value store."""

from __future__ import annotations

import fsspec
import pytest

import dataloader as dl
from dataloader.device.remote_index import shared_array_record_source


class _Store:
    """The runtime's key-value store, in one process."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    def key_value_set(self, key: str, value: str) -> None:
        assert key not in self.values, f"{key} written twice"
        self.values[key] = value

    def blocking_key_value_get(self, key: str, timeout_in_ms: int) -> str:
        if key not in self.values:
            raise RuntimeError(f"DEADLINE_EXCEEDED: {key}")
        return self.values[key]


@pytest.fixture
def bucket(tmp_path):
    store = fsspec.filesystem("memory")
    for part in range(2):
        path = tmp_path / f"part-{part}.array_record"
        dl.write_array_record(path, [b"%d-%d" % (part, i) for i in range(50)])
        store.put(str(path), f"/granary-shared-index/part-{part}.array_record")
    yield store
    store.rm("/granary-shared-index", recursive=True)


def test_other_processes_build_their_source_without_listing_or_reading_indices(bucket, tmp_path):
    client = _Store()
    glob = "memory://granary-shared-index/part-*.array_record"
    remote = dl.RemoteOptions(cache_dir=str(tmp_path / "cache"))
    first = shared_array_record_source(glob, remote=remote, client=client, process_index=0,
                                       process_count=2, name="k")
    assert list(client.values) == ["k"]
    # Had process 1 listed the files or read an index, it would now fail: they are gone.
    bucket.mv("/granary-shared-index", "/granary-moved", recursive=True)
    try:
        with pytest.raises(FileNotFoundError):
            dl.ArrayRecordDataSource(glob, remote=remote)
        other = shared_array_record_source(glob, remote=remote, client=client, process_index=1,
                                           process_count=2, name="k")
        assert other.paths == first.paths and len(other) == 100
        assert other.num_records_per_file == (50, 50)
    finally:
        bucket.mv("/granary-moved", "/granary-shared-index", recursive=True)
    assert other[75] == first[75] == b"1-25"


def test_a_process_waiting_for_process_0_times_out_with_a_clear_error():
    with pytest.raises(TimeoutError, match="process 0 did not post the ArrayRecord indices"):
        shared_array_record_source("memory://nowhere/*.array_record", client=_Store(), process_index=1,
                                   process_count=2, name="k", timeout_s=0)


def test_one_process_or_local_paths_need_no_runtime(bucket, tmp_path):
    source = shared_array_record_source("memory://granary-shared-index/part-0.array_record",
                                        client=_Store(), process_index=0, process_count=1)
    assert len(source) == 50
    path = tmp_path / "local.array_record"
    dl.write_array_record(path, [b"x"])
    client = _Store()
    assert len(shared_array_record_source(str(path), client=client, process_index=1, process_count=2)) == 1
    assert client.values == {}
