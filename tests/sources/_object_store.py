"""A real S3-protocol server on 127.0.0.1 (moto), and a proxy in front of it that adds
latency, drops connections or answers with an error, for the object-store tests and
the benchmark."""

from __future__ import annotations

import contextlib
import re
import socket
import socketserver
import threading
import time
from collections.abc import Iterator
from typing import Any

BUCKET = "data"
CREDENTIALS = {"key": "testing", "secret": "testing"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def s3_server() -> Iterator[str]:
    """Starts moto's S3 server on a free port; yields its endpoint URL; stops it."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@contextlib.contextmanager
def s3_server_process() -> Iterator[str]:
    """moto's S3 server in a process of its own (so that its work does not share this
    process's GIL, as a real store's does not); yields its endpoint URL; stops it."""
    import subprocess
    import sys

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto's S3 server did not start") from None
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=30)


def storage_options(endpoint: str, **more: Any) -> dict[str, Any]:
    """s3fs options for the local server: fixed credentials, no retries of s3fs's own
    (the reader's retries are what the tests look at)."""
    return {
        **CREDENTIALS,
        "endpoint_url": endpoint,
        "client_kwargs": {"region_name": "us-east-1"},
        "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 2, "read_timeout": 5},
        "skip_instance_cache": True,
        **more,
    }


def make_bucket(endpoint: str, files: dict[str, str]) -> None:
    """Creates the bucket and uploads local ``files`` (key -> local path)."""
    import boto3

    client = boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1",
        aws_access_key_id=CREDENTIALS["key"], aws_secret_access_key=CREDENTIALS["secret"],
    )
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket=BUCKET)
    for key, path in files.items():
        client.upload_file(path, BUCKET, key)


class FaultProxy:
    """A TCP proxy that counts requests and injects faults.

    Attributes:
        latency_s: Added before each request is forwarded.
        drop: How many coming requests to answer by closing the connection.
        status: When set (e.g. ``403``), every request gets this HTTP error.
        requests: Requests seen (each chunk of bytes from a client counts as one).
        ranges: The ranged GETs seen, as (object path, first byte, last byte).
        log: Every request seen, as (method, target with its query, first byte, last
            byte), the bytes None where it asks for no range.
    """

    def __init__(self, target: str) -> None:
        host, port = target.rsplit("//", 1)[1].split(":")
        self.target = (host, int(port))
        self.latency_s = 0.0
        self.drop = 0
        self.status: int | None = None
        self.requests = 0
        self.ranges: list[tuple[str, int, int]] = []  # (object path, first byte, last byte)
        self.log: list[tuple[str, str, int | None, int | None]] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                proxy._serve(self.request)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _note_range(self, data: bytes) -> None:
        match = _RANGE.match(data)
        if match:
            path = match.group(1).decode().split("?")[0]
            self.ranges.append((path, int(match.group(2)), int(match.group(3))))
        method, target = data.split(b" ", 2)[:2]
        first, last = (int(match.group(2)), int(match.group(3))) if match else (None, None)
        self.log.append((method.decode(), target.decode(), first, last))

    def _serve(self, client: socket.socket) -> None:
        upstream = socket.create_connection(self.target)
        pump = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
        pump.start()
        try:
            while True:
                data = client.recv(1 << 16)
                if not data:
                    break
                if data[:4] in (b"GET ", b"PUT ", b"HEAD", b"POST", b"DELE"):
                    with self._lock:
                        self.requests += 1
                        self._note_range(data)
                        drop, self.drop = self.drop > 0, max(self.drop - 1, 0)
                    if drop:
                        break
                    if self.status is not None:
                        client.sendall(_error(self.status))
                        break
                    if self.latency_s:
                        time.sleep(self.latency_s)
                upstream.sendall(data)
        except OSError:
            pass
        finally:
            for s in (client, upstream):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()


_RANGE = re.compile(rb"^GET (\S+) .*?\r\nrange: *bytes=(\d+)-(\d+)", re.S | re.I)


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(1 << 16):
            sink.sendall(data)
    except OSError:
        pass


def _error(status: int) -> bytes:
    code, reason = {403: ("AccessDenied", "Forbidden"), 503: ("SlowDown", "Slow Down")}[status]
    body = (
        f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
        f"<Message>{reason}</Message></Error>"
    ).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    return head + body


def classify_requests(
    log: list[tuple[str, str, int | None, int | None]], sizes: dict[str, int], index_name: str
) -> dict[str, int]:
    """A :class:`FaultProxy` log counted by kind: listings, reads and writes of the metadata
    index (``index_name``), a file's metadata (HEADs, ranged reads of its head or tail, where
    an ArrayRecord file's index lies) and data (the other ranged reads). ``sizes``: each
    object's size, by its path (``/bucket/key``)."""
    counts = dict.fromkeys(("listing", "index", "file metadata", "data"), 0)
    for method, target, first, last in log:
        path = target.split("?")[0]
        if "list-type=" in target or "prefix=" in target or path.rstrip("/") == f"/{BUCKET}":
            counts["listing"] += 1
        elif path.endswith(index_name):
            counts["index"] += 1
        elif method == "HEAD" or (first is not None and (first == 0 or last == sizes.get(path, -2) - 1)):
            counts["file metadata"] += 1
        else:
            counts["data"] += 1
    return counts
