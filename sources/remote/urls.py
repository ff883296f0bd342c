"""Paths that are URLs: finding, listing and reading objects through fsspec.

Any ``protocol://`` path is read through `fsspec <https://filesystem-spec.readthedocs.io>`_
and the store's own client behind it (``s3fs`` for ``s3://``, ``gcsfs`` for ``gs://``,
``huggingface_hub`` for ``hf://``, ``adlfs`` for ``az://``), so credentials are found
the way those clients find them (environment, config files, metadata servers);
``storage_options`` are passed to the file system unchanged (``endpoint_url``,
``token``, ``anon``, ...).

Every request goes through :func:`fetch_ranges`, which retries what a retry can cure
(a dropped connection, a timeout, throttling, a 5xx) with exponential backoff, and turns
what it cannot (a missing bucket or object, a 403, no credentials) into an error naming
the object's URL and what to do.
"""

from __future__ import annotations

import functools
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..files.metadata_index import INDEX_NAME, FileStat, mtime_ns

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
_GLOB_CHARS = frozenset("*?[")

RETRIES = 5
"""Attempts per request before a transient failure becomes an error."""

BACKOFF_S = 0.1
"""First wait between attempts; doubled after each (0.1, 0.2, 0.4, 0.8 s)."""

_CREDENTIAL_ERRORS = ("NoCredentialsError", "DefaultCredentialsError", "PartialCredentialsError")
_TRANSIENT = re.compile(
    r"timeout|timed out|throttl|slowdown|slow down|reduce your request rate|too many requests|"
    r"connection|reset|disconnect|broken pipe|incompleteread|short read|internalerror|"
    r"service ?unavailable|\b50[0-4]\b|\b429\b",
    re.IGNORECASE,
)


def is_url(path: object) -> bool:
    """Whether ``path`` is a ``protocol://`` URL (read through fsspec), not a local path."""
    return isinstance(path, str) and bool(_URL.match(path))


def filesystem(url: str, storage_options: Mapping[str, Any] | None = None) -> tuple[Any, str]:
    """The fsspec file system for ``url`` and the path inside it.

    Raises:
        ImportError: fsspec, or the store's client (s3fs, gcsfs, ...), is not installed;
            the message names the pip extra to install.
    """
    try:
        import fsspec.core
    except ImportError as error:  # pragma: no cover - fsspec is in the test environment
        raise ImportError(
            f"reading {url!r} needs fsspec; install it with pip install 'granary[remote]'"
        ) from error
    try:
        return fsspec.core.url_to_fs(url, **dict(storage_options or {}))
    except ImportError as error:
        protocol = url.split("://", 1)[0]
        extra = {"s3": "s3", "gs": "gcs", "gcs": "gcs", "hf": "hf", "az": "azure"}.get(protocol)
        hint = f"pip install 'granary[{extra}]'" if extra else "install the fsspec package for it"
        raise ImportError(f"reading {url!r} needs the {protocol}:// client ({error}); {hint}") from error


def open_path(
    path: str | os.PathLike, mode: str = "rb", storage_options: Mapping[str, Any] | None = None
) -> Any:
    """Opens a local path or a URL as a file object (``open`` for local paths).

    This is the one call the streaming sources and ``convert`` use to open a file,
    so each of them takes URLs.
    """
    path = os.fspath(path)
    if not is_url(path):
        return open(path, mode)
    fs, inner = filesystem(path, storage_options)
    return fs.open(inner, mode)


def pyarrow_filesystem(
    path: str | os.PathLike, storage_options: Mapping[str, Any] | None = None
) -> tuple[Any, str]:
    """``(filesystem, path)`` for pyarrow: ``(None, path)`` for a local path, else the URL's
    fsspec file system wrapped for pyarrow and the path inside it."""
    path = os.fspath(path)
    if not is_url(path):
        return None, path
    import pyarrow.fs

    fs, inner = filesystem(path, storage_options)
    return pyarrow.fs.PyFileSystem(pyarrow.fs.FSSpecHandler(fs)), inner


def expand_urls(
    urls: Sequence[str], *, what: str, example_glob: str, storage_options: Mapping[str, Any] | None = None
) -> list[tuple[str, int]]:
    """Expands URLs and URL globs into ``(url, size)`` of existing objects (see :func:`stat_urls`)."""
    return [(stat.path, stat.size) for stat in stat_urls(
        urls, what=what, example_glob=example_glob, storage_options=storage_options)]


def stat_urls(
    urls: Sequence[str], *, what: str, example_glob: str, storage_options: Mapping[str, Any] | None = None
) -> list[FileStat]:
    """Expands URLs and URL globs into the size and modification time of existing objects.

    A glob is one listing request (its matches sorted, the metadata index left out;
    unlike local paths, a glob character in a URL is always a pattern); a plain URL is
    one metadata request. Raises the errors of :func:`translate` (missing bucket, 403,
    ...), and FileNotFoundError for a glob that matches nothing.
    """
    found: list[FileStat] = []
    for url in urls:
        fs, inner = filesystem(url, storage_options)
        if _GLOB_CHARS.intersection(inner):  # Object names with glob characters: list them.
            details = call(functools.partial(fs.glob, inner, detail=True), url)
            matches = sorted(
                FileStat(fs.unstrip_protocol(name), int(info.get("size") or 0), mtime_ns(info))
                for name, info in details.items()
                if info.get("type") != "directory" and not name.endswith("/" + INDEX_NAME)
            )
            if not matches:
                raise FileNotFoundError(
                    f"URL glob {url!r} matches no object; check the bucket, the prefix and "
                    f"the extension of your {what} files (e.g. {example_glob!r})"
                )
            found.extend(matches)
            continue
        info = call(functools.partial(fs.info, inner), url)
        if info.get("type") == "directory":
            raise ValueError(
                f"{url!r} is a directory, expected a {what} object; pass a glob such as "
                f"{url.rstrip('/') + '/' + example_glob!r}"
            )
        found.append(FileStat(url, int(info.get("size") or 0), mtime_ns(info)))
    return found


def read_object(url: str, storage_options: Mapping[str, Any] | None = None) -> bytes | None:
    """The whole object at ``url`` (one request), None when there is none."""
    fs, inner = filesystem(url, storage_options)
    try:
        # start=0: one ranged GET (s3fs otherwise asks for the object's size first).
        return bytes(call(functools.partial(fs.cat_file, inner, start=0), url))
    except FileNotFoundError:
        return None


def write_object(url: str, data: bytes, storage_options: Mapping[str, Any] | None = None) -> None:
    """Writes ``data`` as the object at ``url`` (one PUT: it appears whole or not at all)."""
    fs, inner = filesystem(url, storage_options)
    call(functools.partial(fs.pipe_file, inner, data), url)


def call(fn: Callable[[], Any], url: str, *, retries: int = RETRIES) -> Any:
    """``fn()``, retried with backoff on transient failures; errors name ``url``."""
    delay = BACKOFF_S
    for attempt in range(1, retries + 1):
        try:
            return fn()
        except Exception as error:
            permanent = translate(error, url)
            if permanent is not None:
                raise permanent from error
            if attempt == retries:
                raise gave_up(error, url, retries) from error
        time.sleep(delay)
        delay *= 2
    raise AssertionError("unreachable")  # pragma: no cover


def fetch_ranges(
    fs: Any,
    url_of: Mapping[str, str],
    paths: Sequence[str],
    starts: Sequence[int],
    ends: Sequence[int],
    *,
    retries: int = RETRIES,
) -> list[bytes]:
    """The bytes ``[start, end)`` of each path, fetched concurrently where the file
    system can (``cat_ranges``), each checked to be whole.

    A range that fails transiently, or comes back short, is fetched again with
    exponential backoff; after ``retries`` attempts the error names the object's URL.
    No partial range is ever returned.
    """
    results: list[bytes | None] = [None] * len(paths)
    todo = list(range(len(paths)))
    delay = BACKOFF_S
    for attempt in range(1, retries + 1):
        got = fs.cat_ranges(
            [paths[i] for i in todo], [starts[i] for i in todo], [ends[i] for i in todo],
            on_error="return",
        )
        failed = []
        last: BaseException | None = None
        for i, value in zip(todo, got, strict=True):
            if isinstance(value, BaseException):
                permanent = translate(value, url_of[paths[i]])
                if permanent is not None:
                    raise permanent from value
                failed.append(i)
                last = value
            elif len(value) != ends[i] - starts[i]:
                failed.append(i)
                last = OSError(
                    f"short read: {len(value)} of {ends[i] - starts[i]} bytes at {starts[i]}"
                )
            else:
                results[i] = bytes(value)
        if not failed:
            return results  # type: ignore[return-value]
        if attempt == retries:
            assert last is not None
            raise gave_up(last, url_of[paths[failed[0]]], retries) from last
        todo = failed
        time.sleep(delay)
        delay *= 2
    raise AssertionError("unreachable")  # pragma: no cover


def translate(error: BaseException, url: str) -> Exception | None:
    """The error to raise for a permanent failure on ``url``, None for a transient one."""
    name = type(error).__name__
    text = str(error)
    if name in _CREDENTIAL_ERRORS or "credential" in text.lower():
        return PermissionError(
            f"no credentials to read {url!r} ({name}: {text}); set them up the way the "
            "store's client finds them (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or "
            "~/.aws for s3://, `gcloud auth application-default login` for gs://, "
            "HF_TOKEN for hf://), pass them in storage_options, or use "
            "storage_options={'anon': True} for public data"
        )
    if isinstance(error, PermissionError) or re.search(r"\b403\b|AccessDenied|Forbidden", text):
        return PermissionError(
            f"access to {url!r} was denied (403: {text}); the credentials found have no "
            "read permission on this object: check the bucket policy / IAM role, or "
            "pass other credentials in storage_options"
        )
    if isinstance(error, FileNotFoundError) or re.search(r"NoSuchBucket|NoSuchKey|\b404\b", text):
        bucket = "bucket or " if "NoSuchBucket" in text or "bucket" in text.lower() else ""
        return FileNotFoundError(
            f"{url!r} does not exist (no such {bucket}object: {text or name}); check the "
            "bucket name and the object's path"
        )
    if isinstance(error, (ValueError, TypeError, ImportError, NotImplementedError)):
        return error if isinstance(error, Exception) else None
    if isinstance(error, (OSError, TimeoutError, ConnectionError)) or _TRANSIENT.search(
        f"{name} {text}"
    ):
        return None
    return error if isinstance(error, Exception) else None


def gave_up(error: BaseException, url: str, retries: int) -> OSError:
    """The error after ``retries`` transient failures reading ``url``."""
    return OSError(
        f"reading {url!r} failed {retries} times in a row (last: {type(error).__name__}: "
        f"{error}); the store is unreachable, dropping connections or throttling: check "
        "the network and endpoint, or read with fewer workers"
    )


def parquet_file(
    path: str | os.PathLike, storage_options: Mapping[str, Any] | None = None, **read_kwargs: Any
) -> Any:
    """``pyarrow.parquet.ParquetFile`` for a local path or a URL (through fsspec, with
    ``storage_options``, unless ``read_kwargs`` brings its own ``filesystem``)."""
    import pyarrow.parquet as pq

    path = os.fspath(path)
    if is_url(path) and read_kwargs.get("filesystem") is None:
        fs, inner = pyarrow_filesystem(path, storage_options)
        return pq.ParquetFile(inner, **{**read_kwargs, "filesystem": fs})
    return pq.ParquetFile(path, **read_kwargs)
