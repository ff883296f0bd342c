"""Shared test helpers: deep equality of nested outputs, restore-at-every-step, waiting."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

# The repository's root folder (configs/, README.md, ...), wherever a test file sits.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def assert_tree_equal(a: Any, b: Any, path: str = "") -> None:
    """Asserts two nested structures of arrays/scalars are equal, naming the first difference."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{path}: keys {a.keys()} vs {b}"
        for k in a:
            assert_tree_equal(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (tuple, list)):
        assert type(a) is type(b) and len(a) == len(b), f"{path}: {a!r} vs {b!r}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_tree_equal(x, y, f"{path}[{i}]")
    elif isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a_, b_ = np.asarray(a), np.asarray(b)
        assert a_.shape == b_.shape and a_.dtype == b_.dtype, f"{path}: {a_.shape}/{a_.dtype} vs {b_.shape}/{b_.dtype}"
        assert np.array_equal(a_, b_), f"{path}: {a_} != {b_}"
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def assert_streams_equal(a: list[Any], b: list[Any]) -> None:
    assert len(a) == len(b), f"streams differ in length: {len(a)} vs {len(b)}"
    for i, (x, y) in enumerate(zip(a, b)):
        assert_tree_equal(x, y, f"output {i}")


def take(iterator: Any, limit: int | None) -> list[Any]:
    return list(itertools.islice(iterator, limit))


# How long a test waits for something that happens in the background (a worker stops, a
# block is freed, a thread ends) before calling it a failure. On an idle machine these
# take milliseconds; beside other jobs on two cores they have taken seconds, so the
# deadline is generous: waiting ends as soon as the condition holds, a pass costs nothing.
PATIENCE_S = 60.0


def memfds(prefix: str = "/memfd:granary-") -> dict[int, str]:
    """This process's open memfds whose link starts with ``prefix``: descriptor -> link
    (``/memfd:<name> (deleted)``)."""
    found = {}
    for entry in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, closed by now
            target = os.readlink(f"/proc/self/fd/{entry}")
            if target.startswith(prefix):
                found[int(entry)] = target
    return found


def wait_until(predicate: Callable[[], bool], timeout: float = PATIENCE_S) -> bool:
    """Polls ``predicate`` until it is true or ``timeout`` seconds pass; returns its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def wait_full(iterator: Any, timeout: float = PATIENCE_S) -> None:
    """Waits until both buffers of a device iterator are full, so a state is taken under load.

    Full means ``cpu_buffer_size`` batches waiting on the host and ``device_buffer_size``
    already transferred. Fails (AssertionError) if that does not happen within ``timeout``.
    """
    feed = iterator._res.feed
    assert wait_until(
        lambda: feed.host.full() and len(feed.device) == iterator.device_buffer_size, timeout=timeout
    ), f"the device iterator's buffers did not fill within {timeout} s"


# Put first in every script a test starts. A shell runs a background job with SIGINT
# ignored, and a child inherits that, so without the first line a test of Ctrl-C run as
# `make test &` would wait in vain for a KeyboardInterrupt. The watchdog ends the
# script's process group once the test process is gone (killed, or ended by a timeout
# that skipped its cleanup), so no script outlives the run that started it.
_PRELUDE = """\
import os as _os, signal as _signal, threading as _threading, time as _time
_signal.signal(_signal.SIGINT, _signal.default_int_handler)
def _watch(parent=_os.getppid()):
    while _os.getppid() == parent:
        _time.sleep(0.5)
    _os.killpg(0, _signal.SIGKILL)
_threading.Thread(target=_watch, name="test-watchdog", daemon=True).start()
"""


@contextlib.contextmanager
def python_script(body: str, **popen_kwargs: Any) -> Iterator[subprocess.Popen]:
    """Runs ``body`` (dedented) in a new Python process from the repository's root.

    Yields the process, with text pipes for stdout and stderr. The child takes Ctrl-C as a
    terminal's foreground job would, whatever the test process ignores, and runs in its
    own session (process group): when the block ends, however it ends (a failed assert, a
    timeout), the whole group is killed, and should the test process die first, the
    child kills its group itself. No script outlives its test.
    """
    proc = subprocess.Popen(
        [sys.executable, "-c", _PRELUDE + textwrap.dedent(body)], cwd=REPO_ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        **popen_kwargs,
    )
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.kill()
        proc.communicate()


def _continuation(make_iterator: Callable[[], Any], state: Any, limit: int = 5) -> list[Any]:
    it = make_iterator()
    it.set_state(state)
    rest = take(it, limit)
    if hasattr(it, "close"):
        it.close()
    return rest


def assert_restores_everywhere(
    make_iterator: Callable[[], Any],
    limit: int = 60,
    fresh_iterator_every: int = 1,
) -> list[Any]:
    """Restores at every step and checks the rest equals the uninterrupted stream.

    Runs the pipeline once (up to ``limit`` outputs), recording the state after each
    output, then for every step ``k`` restores from the state after ``k`` outputs
    (round-tripped through JSON, as a checkpoint would) and compares everything that
    follows, to the same limit, with the uninterrupted run. Every ``fresh_iterator_every``
    steps the restore goes into a new iterator, otherwise into the one already open
    (``set_state`` on a running iterator must work too). Epoch boundaries are among the
    steps whenever the stream crosses one.

    Returns:
        The uninterrupted outputs.
    """
    it = make_iterator()
    states = [json.dumps(it.get_state())]
    outputs = []
    for x in itertools.islice(it, limit):
        outputs.append(x)
        states.append(json.dumps(it.get_state()))
    if hasattr(it, "close"):
        it.close()
    reused = make_iterator()
    try:
        for k, state in enumerate(states):
            target = make_iterator() if k % fresh_iterator_every == 0 else reused
            target.set_state(json.loads(state))
            rest = take(target, limit - k)
            assert_streams_equal(rest, outputs[k:])
            # Having caught up, the restored iterator is exactly where the original ended,
            # or (past the last output a filter or flat map may read inputs that produce
            # nothing) both states resume to an empty stream.
            final, expected = json.loads(json.dumps(target.get_state())), json.loads(states[-1])
            if final != expected:
                assert len(rest) < limit - k, f"states differ after step {k}: {final} vs {expected}"
                assert _continuation(make_iterator, final) == [] == _continuation(make_iterator, expected)
            if target is not reused and hasattr(target, "close"):
                target.close()
    finally:
        if hasattr(reused, "close"):
            reused.close()
    return outputs


def open_files_under(folder: Any) -> list[str]:
    """The files under ``folder`` that this process holds open (from /proc/self/fd)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(folder)):
            found.append(target)
    return found


def two_array_record_files(folder: Any, corrupt: int) -> str:
    """Writes ``a.array_record`` and ``b.array_record`` (20 records each) with the real
    ArrayRecord writer into ``folder``, then flips bytes inside the chunk of record
    ``corrupt`` of ``b``, so the reader fails on it (global record ``20 + corrupt``)
    with a hash mismatch. Returns the glob of both files.

    Written uncompressed, so that a record's bytes can be found in the file.
    """
    from dataloader.sources import write_array_record

    for file, name in enumerate("ab"):
        records = [f"file{file}-record{i:03d}-".encode() * 20 for i in range(20)]
        path = os.path.join(str(folder), f"{name}.array_record")
        write_array_record(path, records, options="uncompressed")
    with open(path, "rb") as f:
        data = bytearray(f.read())
    offset = data.find(records[corrupt])
    assert offset >= 0 and data.find(records[corrupt], offset + 1) < 0, "record not unique"
    for i in range(offset + 4, offset + 12):
        data[i] ^= 0xFF
    with open(path, "wb") as f:
        f.write(bytes(data))
    return os.path.join(str(folder), "*.array_record")


def run_threads(function: Callable[[int], None], count: int) -> None:
    """Runs ``function(0)`` ... ``function(count - 1)`` in threads at once; waits for all."""
    import threading

    threads = [threading.Thread(target=function, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
