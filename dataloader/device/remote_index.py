"""ArrayRecord files in an object store, opened on many hosts with one listing.

Building :class:`~dataloader.sources.ArrayRecordDataSource` over URLs costs a listing
and one ranged request per file (its chunk index). On a job of ``H`` hosts each would
pay it, ``H`` times the requests at once at the store. :func:`shared_array_record_source`
has JAX process 0 list the files and read their indices (or take them from the metadata
index, :mod:`dataloader.sources.files.metadata_index`, checked against the listing); it posts
the listing and the index entries (about 16 bytes a chunk, and the files' small head and
tail bytes, compressed) in the **key-value store of JAX's distributed runtime**, and every
other process builds its source from them without a request to the store: the metadata
requests of a job are those of one host. Workers of every host get the indices in the pickled source, as
usual. This lives here, not in ``sources``, because it needs JAX's runtime.
"""

from __future__ import annotations

import base64
import dataclasses
import itertools
import json
import time
import zlib
from collections.abc import Mapping
from typing import Any

from dataloader.sources import ArrayRecordDataSource, RemoteOptions
from dataloader.sources.files.metadata_index import MetadataIndex
from dataloader.sources.remote import is_url

_calls = itertools.count()


def shared_array_record_source(
    paths: str | list[str],
    reader_options: Mapping[str, str] | None = None,
    *,
    storage_options: Mapping[str, Any] | None = None,
    remote: RemoteOptions | None = None,
    timeout_s: float = 600.0,
    client: Any = None,
    process_index: int | None = None,
    process_count: int | None = None,
    name: str | None = None,
) -> ArrayRecordDataSource:
    """``ArrayRecordDataSource(paths, ...)`` whose listing and indices process 0 reads alone.

    Call it on every process with the same arguments (as an SPMD program does). With one
    process, or paths that are not URLs, it is ``ArrayRecordDataSource`` itself.

    Args:
        paths, reader_options, storage_options, remote: as for ``ArrayRecordDataSource``.
            ``remote.index_cache``, when given, is used by process 0 as usual.
        timeout_s: how long a process waits for process 0's indices before raising.
        client, process_index, process_count: the store's client (``key_value_set``,
            ``blocking_key_value_get``) and this process's place; None: JAX's
            (``jax.distributed.initialize`` must have run). For tests.
        name: the key, the same on every host; None: numbered in the order this process
            calls this function (the same order on every host of an SPMD program).

    Raises:
        RuntimeError: several processes but no distributed runtime.
        TimeoutError: process 0 did not post the indices within ``timeout_s``.

    Example:
        >>> source = shared_array_record_source("s3://bucket/train/*.array_record")  # doctest: +SKIP
    """
    items = [paths] if isinstance(paths, str) else list(paths)
    key = name if name is not None else f"granary/remote-index/{next(_calls)}"
    if client is None:
        import jax
        from jax._src import distributed

        client = distributed.global_state.client
        process_index, process_count = jax.process_index(), jax.process_count()
    index, count = int(process_index or 0), int(process_count or 1)
    options = remote or RemoteOptions()
    if count == 1 or not all(is_url(str(p)) for p in items):
        return ArrayRecordDataSource(paths, reader_options, storage_options=storage_options, remote=remote)
    if client is None:
        raise RuntimeError(
            f"{count} JAX processes but the distributed runtime has no client; call "
            "jax.distributed.initialize() before shared_array_record_source"
        )
    if storage_options is not None:
        options = dataclasses.replace(options, storage_options=storage_options)
    if index == 0:
        # Process 0 uses (and writes) remote.index_cache when given, as any source does.
        shared = (MetadataIndex.load(options.index_cache, options.storage_options)
                  if options.index_cache is not None else MetadataIndex())
        source = ArrayRecordDataSource(paths, reader_options, remote=options, index=shared)
        posted = MetadataIndex()
        posted.entries = {url: shared.entries[url] for url in source.paths}
        payload = json.dumps({"paths": list(source.paths), "index": posted.to_bytes().decode()})
        client.key_value_set(key, base64.b64encode(zlib.compress(payload.encode())).decode())
        return source
    payload = json.loads(zlib.decompress(base64.b64decode(_wait(client, key, timeout_s))))
    # An index received stands for the store: process 0 checked it a moment ago.
    received = MetadataIndex.from_bytes(payload["index"].encode())
    return ArrayRecordDataSource(payload["paths"], reader_options, remote=options, index=received)


def _wait(client: Any, key: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return str(client.blocking_key_value_get(key, 1000))
        except Exception as exc:  # the runtime's deadline error has no class of its own
            if "DEADLINE" not in str(exc).upper():
                raise
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"process 0 did not post the ArrayRecord indices ({key}) within {timeout_s:.0f} s; "
                "is it building the same source (same paths, same order of calls)?"
            )
