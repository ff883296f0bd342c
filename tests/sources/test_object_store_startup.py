"""Start-up of several hosts against an S3 server (moto on 127.0.0.1): the metadata
requests of the whole job, counted at a proxy, with and without the metadata index.

Four hosts build the same 16-file ArrayRecord data set in turn, each with a cache folder
of its own (hosts share no disk), and read a first batch. The counts do not depend on
timing: each host's start-up is a fixed set of requests.
"""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest

pytest.importorskip("moto.server")
pytest.importorskip("s3fs")

import dataloader as dl
from dataloader.cli.index import build_index
from dataloader.device.remote_index import shared_array_record_source
from dataloader.sources.files.metadata_index import INDEX_NAME

from ._object_store import (
    BUCKET,
    FaultProxy,
    classify_requests,
    make_bucket,
    s3_server,
    storage_options,
)

logging.getLogger("werkzeug").setLevel(logging.ERROR)

FILES, HOSTS = 16, 4
GLOB = f"s3://{BUCKET}/startup/*.array_record"


class KeyValue:
    """The runtime's key-value store, in one process."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    def key_value_set(self, key: str, value: str) -> None:
        self.values[key] = value

    def blocking_key_value_get(self, key: str, timeout_in_ms: int) -> str:
        return self.values[key]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    import s3fs

    patch = pytest.MonkeyPatch()
    patch.setattr(s3fs.S3FileSystem, "retries", 1)
    folder = tmp_path_factory.mktemp("startup")
    files, sizes = {}, {}
    rng = np.random.default_rng(0)
    for f in range(FILES):
        path = folder / f"part-{f:02d}.array_record"
        dl.write_array_record(path, [rng.bytes(100) for _ in range(20)])
        files[f"startup/{path.name}"] = str(path)
        sizes[f"/{BUCKET}/startup/{path.name}"] = os.path.getsize(path)
    with s3_server() as endpoint, FaultProxy(endpoint) as proxy:
        make_bucket(endpoint, files)
        yield {"proxy": proxy, "sizes": sizes, "options": storage_options(proxy.url)}
    patch.undo()


def remote(store, folder, host: int, **more) -> dl.RemoteOptions:
    return dl.RemoteOptions(cache_dir=str(folder / f"host-{host}"), whole_file_bytes=0,
                            storage_options=store["options"], **more)


def start(source, host: int) -> list[bytes]:
    """A host's first batch of its shard, read in this process."""
    ds = dl.MapDataset.source(source).seed(0).shuffle()[host::HOSTS].batch(8)
    return list(next(iter(ds.to_iter_dataset())))


def requests(store, run) -> dict[str, int]:
    store["proxy"].log.clear()
    run()
    return classify_requests(list(store["proxy"].log), store["sizes"], INDEX_NAME)


def metadata(counts: dict[str, int]) -> int:
    return sum(n for kind, n in counts.items() if kind != "data")


def test_without_an_index_every_host_reads_every_files_index(store, tmp_path):
    counts = requests(store, lambda: [
        start(dl.ArrayRecordDataSource(GLOB, remote=remote(store, tmp_path, h), index=False), h)
        for h in range(HOSTS)])
    assert counts["listing"] == HOSTS and counts["file metadata"] >= HOSTS * FILES
    assert metadata(counts) > FILES + HOSTS


def test_hosts_share_what_one_host_reads_so_the_job_makes_at_most_files_plus_hosts(store, tmp_path):
    client = KeyValue()

    def job():
        for h in range(HOSTS):  # host 0 posts; the others build from what it posted
            source = shared_array_record_source(GLOB, remote=remote(store, tmp_path, h), client=client,
                                                process_index=h, process_count=HOSTS, name="startup")
            assert len(source) == FILES * 20
            start(source, h)

    counts = requests(store, job)
    assert metadata(counts) <= FILES + HOSTS, counts
    assert counts["listing"] == 1  # host 0's
    assert counts["data"] > 0


def test_with_the_index_built_ahead_a_host_lists_and_reads_the_index_only(store, tmp_path):
    built = requests(store, lambda: build_index([GLOB], storage_options=store["options"]))
    # Once each file's index, a listing, and reading (none yet) and writing the index.
    assert built["file metadata"] == FILES and metadata(built) <= FILES + 4, built
    batches = []
    counts = requests(store, lambda: batches.extend(
        start(dl.ArrayRecordDataSource(GLOB, remote=remote(store, tmp_path, h)), h) for h in range(HOSTS)))
    # Per host: one listing (to check the files against the index) and one read of it;
    # no file's index or edges are read (they are in the index).
    assert counts["listing"] == HOSTS and counts["index"] == HOSTS, counts
    assert counts["file metadata"] == 0, counts
    without = [start(dl.ArrayRecordDataSource(GLOB, remote=remote(store, tmp_path / "again", h), index=False), h)
               for h in range(HOSTS)]
    assert batches == without  # the same first batches as without the index
