"""ArrayRecord and streams read straight from an S3-protocol server (moto, on
127.0.0.1), with latency, dropped connections and errors injected by a proxy."""

from __future__ import annotations

import logging
import os
import pickle

import numpy as np
import pytest

pytest.importorskip("moto.server")
pytest.importorskip("s3fs")

import dataloader as dl
from dataloader.sources import ArrayRecordDataSource, RemoteOptions, write_array_record
from dataloader.sources.remote import chunk_index, is_url, open_path

from ._object_store import BUCKET, FaultProxy, make_bucket, s3_server, storage_options

logging.getLogger("werkzeug").setLevel(logging.ERROR)


def _records(seed: int, n: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [rng.bytes(int(rng.integers(200, 2000))) for _ in range(n)]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """The server, a proxy in front of it, and two files uploaded (plus local copies).

    s3fs's own retry loop (5 tries with backoff, a class attribute) is cut to one try:
    the reader's retries are what these tests are about, and they stay quick.
    """
    import s3fs

    patch = pytest.MonkeyPatch()
    patch.setattr(s3fs.S3FileSystem, "retries", 1)
    folder = tmp_path_factory.mktemp("object_store")
    local = []
    for i, (n, options) in enumerate([(700, None), (500, "uncompressed")]):
        path = folder / f"part-{i}.array_record"
        write_array_record(path, _records(i, n), options=options)
        local.append(str(path))
    with s3_server() as endpoint, FaultProxy(endpoint) as proxy:
        make_bucket(endpoint, {os.path.basename(p): p for p in local})
        yield {"endpoint": endpoint, "proxy": proxy, "local": local, "folder": folder}
    patch.undo()


@pytest.fixture
def proxy(store):
    proxy = store["proxy"]
    proxy.latency_s, proxy.drop, proxy.status = 0.0, 0, None
    yield proxy
    proxy.latency_s, proxy.drop, proxy.status = 0.0, 0, None


def _source(store, proxy, **remote) -> ArrayRecordDataSource:
    remote.setdefault("cache_dir", str(store["folder"] / "cache"))
    remote.setdefault("whole_file_bytes", 0)
    remote.setdefault("retries", 3)
    return ArrayRecordDataSource(
        f"s3://{BUCKET}/part-*.array_record",
        storage_options=storage_options(proxy.url),
        remote=RemoteOptions(**remote),
    )


def test_shuffled_reads_equal_local_reads(store, proxy):
    local = ArrayRecordDataSource(store["local"])
    with _source(store, proxy) as source:
        assert len(source) == len(local) == 1200
        assert source.paths == tuple(f"s3://{BUCKET}/part-{i}.array_record" for i in range(2))
        order = np.random.default_rng(0).permutation(len(local))
        for start in range(0, len(order), 96):
            batch = order[start : start + 96]
            assert source.__getitems__(batch) == local.__getitems__(batch)
        assert source[1199] == local[1199]
        assert source.remote_stats["requests"] > 0


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_workers_read_what_local_files_give(store, proxy):
    local = ArrayRecordDataSource(store["local"])
    sampler = dl.IndexSampler(len(local), shuffle=True, seed=3, num_epochs=1)
    expected = list(dl.DataLoader(local, sampler, worker_count=0))
    with _source(store, proxy) as source:
        seen = len(proxy.ranges)
        got = list(dl.DataLoader(source, sampler, worker_count=2))
    assert got == expected
    # The workers read chunks only: no ranged read reaches a file's index at its end.
    sizes = {f"/{BUCKET}/{os.path.basename(p)}": os.path.getsize(p) for p in store["local"]}
    worker_ranges = proxy.ranges[seen:]
    assert worker_ranges and all(last < sizes[path] - 1 for path, _, last in worker_ranges)


def test_index_is_read_once_and_travels_to_workers(store, proxy, tmp_path):
    before = proxy.requests
    source = _source(store, proxy, index_cache=str(tmp_path / "index.json"))
    listing_and_index = proxy.requests - before
    # A glob: one listing, then one ranged read per file (its index).
    assert listing_and_index <= 1 + 2 + 1  # and once the 64-byte file signature
    worker = pickle.loads(pickle.dumps(source))
    before = proxy.requests
    worker.__getitems__([0, 650, 1100])
    # The worker fetches chunks only: its index came pickled, its head and tail bytes
    # from cache_dir.
    assert proxy.requests - before == worker.remote_stats["requests"] <= 3
    before = proxy.requests
    again = _source(store, proxy, index_cache=str(tmp_path / "index.json"))
    # Started from the index: one listing (to check the files' sizes and times against
    # it), not one read of a file.
    assert proxy.requests == before + 1
    assert again.num_records_per_file == source.num_records_per_file == (700, 500)
    assert again[650] == source[650]
    for s in (source, worker, again):
        s.close()


def test_cache_budget_is_kept_and_evicted_chunks_are_fetched_again(store, proxy):
    budget = 48 << 10
    local = ArrayRecordDataSource(store["local"])
    with _source(store, proxy, cache_bytes=budget) as source:
        order = np.random.default_rng(1).permutation(len(local))
        for start in range(0, len(order), 8):
            batch = order[start : start + 8]
            assert source.__getitems__(batch) == local.__getitems__(batch)
            assert source.remote_stats["cached_bytes"] <= budget
        fetcher = source._fetch_state()
        assert fetcher._budget.evicted > 0
        files = [f for f in fetcher._sparse if f is not None]
        index_bytes = sum(os.path.getsize(p) - f.offsets[-1] + f.offsets[0]
                          for p, f in zip(store["local"], files, strict=True))
        # On disk: the budget, the index bytes, and at most a 4 KiB page of slack per chunk edge.
        slack = 2 * 4096 * (budget // 200 + 2) + 2 * 4096
        assert sum(f.allocated() for f in files) <= budget + index_bytes + slack
        first = source.remote_stats["requests"]
        assert source.__getitems__(order[:8]) == local.__getitems__(order[:8])
        assert source.remote_stats["requests"] > first  # evicted, so fetched again


def test_sources_of_a_mixture_share_one_budget(store, proxy):
    budget = 40 << 10
    local = ArrayRecordDataSource(store["local"])
    with _source(store, proxy, cache_bytes=budget) as one, _source(store, proxy, cache_bytes=budget) as two:
        assert one._fetch_state()._budget is two._fetch_state()._budget
        order = np.random.default_rng(2).permutation(len(local))
        for start in range(0, 400, 8):
            batch = order[start : start + 8]
            assert one.__getitems__(batch) == local.__getitems__(batch)
            assert two.__getitems__(batch[::-1]) == local.__getitems__(batch[::-1])
            assert two.remote_stats["cached_bytes"] <= budget


def test_small_files_are_downloaded_whole_when_the_rule_says_so(store, proxy):
    with _source(store, proxy, whole_file_bytes=1 << 30) as source:
        source.__getitems__([3, 600])
        assert source.remote_stats["requests"] == 1
        source.__getitems__(list(range(0, 700, 7)))
        assert source.remote_stats["requests"] == 1  # the whole file is there
    with _source(store, proxy, whole_file_bytes=0) as source:
        source.__getitems__([3])
        assert source.remote_stats["bytes_fetched"] < 4096


def test_prefetched_records_are_read_without_a_request(store, proxy):
    local = ArrayRecordDataSource(store["local"])
    with _source(store, proxy) as source:
        coming = [7, 300, 650, 1000]
        source.prefetch(coming)
        for pending in source._fetch_state()._pending:
            pending.result()
        before = proxy.requests
        assert source.__getitems__(coming) == local.__getitems__(coming)
        assert proxy.requests == before


def test_a_chunk_missing_from_the_cache_is_an_error_never_a_wrong_record(store, proxy):
    with _source(store, proxy) as source:
        source.__getitems__([10])
        fetcher = source._fetch_state()
        sparse = fetcher._sparse[0]
        chunk = int(source._remote_files[0].index.chunks_of(np.array([10]))[0])
        sparse.drop(chunk)  # as if evicted behind the reader's back
        from array_record.python.array_record_module import ArrayRecordReader

        reader = ArrayRecordReader(sparse.path, "readahead_buffer_size:0,max_parallelism:0")
        try:
            with pytest.raises(RuntimeError, match=r"(?i)corrupt|hash|checksum"):
                reader.read(10, 11)
        finally:
            reader.close()


def test_dropped_connections_are_retried(store, proxy):
    local = ArrayRecordDataSource(store["local"])
    with _source(store, proxy) as source:
        proxy.drop = 2
        assert source.__getitems__([5, 900]) == local.__getitems__([5, 900])
        assert proxy.drop == 0


def test_a_connection_that_keeps_dropping_is_a_clear_error(store, proxy):
    with _source(store, proxy) as source:
        proxy.drop = 1000
        with pytest.raises(OSError, match=r"s3://data/part-0.array_record.*failed 3 times"):
            source.__getitems__([5])
        proxy.drop = 0
        assert len(source[5]) >= 200  # the next read works: no half-written chunk is kept


def test_throttling_is_retried_then_reported(store, proxy):
    with _source(store, proxy) as source:
        proxy.status = 503
        with pytest.raises(OSError, match=r"s3://data/part-1.array_record.*failed 3 times"):
            source[900]


def test_forbidden_is_a_permission_error_naming_the_object(store, proxy):
    with _source(store, proxy) as source:
        proxy.status = 403
        with pytest.raises(PermissionError, match=r"s3://data/part-0.array_record.*denied"):
            source[1]
    with pytest.raises(PermissionError, match="denied"):
        _source(store, proxy)


def test_missing_bucket_and_object(store, proxy):
    options = storage_options(proxy.url)
    with pytest.raises(FileNotFoundError, match=r"s3://nope/x.array_record.*bucket name"):
        ArrayRecordDataSource("s3://nope/x.array_record", storage_options=options)
    with pytest.raises(FileNotFoundError, match=r"matches no object"):
        ArrayRecordDataSource(f"s3://{BUCKET}/none-*.array_record", storage_options=options)


def test_no_credentials(store, proxy, monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    options = {k: v for k, v in storage_options(proxy.url).items() if k not in ("key", "secret")}
    with pytest.raises(PermissionError, match=r"no credentials to read 's3://data/"):
        ArrayRecordDataSource(f"s3://{BUCKET}/part-0.array_record", storage_options=options)


def test_a_file_that_is_not_array_record(store, proxy, tmp_path):
    path = tmp_path / "x.array_record"
    path.write_bytes(b"\1" * (1 << 16))
    make_bucket(store["endpoint"], {"bad.array_record": str(path)})
    with pytest.raises(ValueError, match=r"s3://data/bad.array_record.*not a readable"):
        ArrayRecordDataSource(f"s3://{BUCKET}/bad.array_record",
                              storage_options=storage_options(proxy.url))


def test_urls_and_local_paths_do_not_mix(store):
    with pytest.raises(ValueError, match="mixes URLs and local paths"):
        ArrayRecordDataSource([store["local"][0], f"s3://{BUCKET}/part-0.array_record"])


@pytest.mark.parametrize("options", [None, "uncompressed", "brotli"])
def test_chunk_index_matches_the_reader(tmp_path, options):
    path = tmp_path / "x.array_record"
    write_array_record(path, _records(5, 300), options=options)
    data = path.read_bytes()
    index = chunk_index.parse(data, 0, len(data))
    assert index.num_records == 300 and index.num_chunks == 300
    assert "group_size:1" in index.writer_options
    again = chunk_index.ChunkIndex.from_json(index.to_json())
    assert np.array_equal(again.offsets, index.offsets)
    assert np.array_equal(again.first_record, index.first_record)


def test_open_path_takes_urls_and_paths(tmp_path):
    import fsspec

    with fsspec.open("memory://granary-test/a.txt", "wb") as f:
        f.write(b"hello")
    assert is_url("memory://granary-test/a.txt") and not is_url(str(tmp_path))
    with open_path("memory://granary-test/a.txt") as f:
        assert f.read() == b"hello"


def test_streams_sources_and_convert_take_urls(store, proxy, tmp_path, monkeypatch):
    """Parquet and TFRecord from s3://, credentials and endpoint found the way the
    store's client finds them (here the environment), as on a training host."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dataloader.cli.convert import convert

    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    pq.write_table(pa.table({"id": [1, 2, 3]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": [4, 5]}), tmp_path / "b.parquet")
    dl.write_tfrecord(tmp_path / "r.tfrecord", [b"x", b"yy"])
    make_bucket(store["endpoint"], {f"t/{n}": str(tmp_path / n)
                                    for n in ("a.parquet", "b.parquet", "r.tfrecord")})
    rows = list(dl.experimental.ParquetIterDataset(f"s3://{BUCKET}/t/*.parquet"))
    assert sorted(int(r["id"]) for r in rows) == [1, 2, 3, 4, 5]
    source = dl.ParquetDataSource(f"s3://{BUCKET}/t/*.parquet")
    assert len(source) == 5 and int(source[3]["id"]) == 4
    assert list(dl.experimental.TFRecordIterDataset(f"s3://{BUCKET}/t/r.tfrecord")) == [b"x", b"yy"]
    out = convert([f"s3://{BUCKET}/t/*.parquet"], str(tmp_path / "out" / "rows"), progress=False)
    assert len(ArrayRecordDataSource(out)) == 5


def test_a_pipeline_config_takes_urls_and_remote_options(tmp_path):
    import fsspec

    from dataloader.config import parse_config

    write_array_record(tmp_path / "q.array_record", [b"a", b"b", b"c"])
    fsspec.filesystem("memory").put(str(tmp_path / "q.array_record"), "/granary-cfg/q.array_record")
    config = parse_config({
        "source": {"kind": "array_record", "paths": "memory://granary-cfg/*.array_record",
                   "options": {"remote": {"cache_bytes": 1 << 20, "cache_dir": str(tmp_path)}}},
        "sampler": {"shuffle": False},
    })
    with config.source.build() as source:
        assert source.__getitems__([2, 0]) == [b"c", b"a"]
    with pytest.raises(Exception, match="matches no object"):
        parse_config({"source": {"kind": "array_record", "paths": "memory://granary-cfg/none-*"}})


def test_open_readers_are_capped_across_sources_least_recently_used_first(store, proxy):
    from dataloader.sources.files.handles import OPEN_FILES

    batches = ([3, 650], [699, 700], [1199], [5])
    with ArrayRecordDataSource(store["local"]) as local:
        expected = [local.__getitems__(batch) for batch in batches]
    limit = OPEN_FILES.limit
    try:
        with _source(store, proxy, max_open_readers=1) as one, _source(store, proxy, max_open_readers=1) as two:
            evicted = OPEN_FILES.evicted
            for batch, records in zip(batches, expected):
                assert one.__getitems__(batch) == records
                assert two.__getitems__(batch) == records
                # One call held both files' readers (and its sparse files' descriptors);
                # once it returned, one handle stays open.
                assert len(OPEN_FILES) == 1
            assert OPEN_FILES.evicted - evicted >= 7
        assert len(OPEN_FILES) == 0
    finally:
        OPEN_FILES.set_limit(limit)


def test_max_open_readers_is_checked():
    with pytest.raises(ValueError, match="max_open_readers is 0; pass the number of files"):
        RemoteOptions(max_open_readers=0)
