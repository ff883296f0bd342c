"""Operations used by the worker tests (importable by child processes)."""

from __future__ import annotations

import glob
import os
import signal
import time

import numpy as np


def slow_identity(x):
    time.sleep(0.002)
    return x


def to_array(x):
    return {"x": np.full((16, 16), x, dtype=np.int32), "id": x}


def raise_on_17(x):
    if x == 17:
        raise ZeroDivisionError("record 17 is cursed")
    return x


def kill_self_on(record):
    def fn(x):
        if x == record:
            os.kill(os.getpid(), signal.SIGKILL)
        return x

    return fn


def kill_once_marker(path):
    """Kills its worker the first time it sees record 25 (a marker file remembers)."""

    def fn(x):
        if x == 25 and not os.path.exists(path):
            open(path, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return x

    return fn


def record_init(path):
    def init(index, count):
        with open(f"{path}/{index}-of-{count}-{os.getpid()}", "w"):
            pass

    return init


def gated_init(marker, release, only=None):
    """A worker init that leaves ``marker-INDEX`` and then waits for the file ``release``:
    the worker is not ready until the test (or :func:`open_gate_on`) says so. ``only``:
    the one worker index that waits (None: every worker)."""

    def init(index, count):
        if only is not None and index != only:
            return
        open(f"{marker}-{index}", "w").close()
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and not os.path.exists(release):
            time.sleep(0.01)

    return init


def open_gate_on(record, marker, release, settle_s=1.0):
    """On ``record``: waits until a worker of :func:`gated_init` is in its init, lets the
    workers go on, and gives them ``settle_s`` to report ready."""

    def fn(x):
        if x == record:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not glob.glob(f"{glob.escape(marker)}-*"):
                time.sleep(0.01)
            open(release, "w").close()
            time.sleep(settle_s)
        return x

    return fn


def hang_on(record, marker_dir=None, release=None):
    """Hangs on ``record``, for good or until the file ``release`` exists.

    Each start on the record leaves a file in ``marker_dir`` (to count attempts).
    """

    def fn(x):
        if x == record:
            if marker_dir is not None:
                open(os.path.join(marker_dir, f"{os.getpid()}-{time.monotonic_ns()}"), "w").close()
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline and not (release and os.path.exists(release)):
                time.sleep(0.02)
        return x

    return fn


def sleep_on(record, seconds):
    def fn(x):
        if x == record:
            time.sleep(seconds)
        return x

    return fn


class CustomBaseException(BaseException):
    pass


def raise_base_on(record, kind):
    """Raises a BaseException of ``kind`` on ``record``, as user code might."""

    def fn(x):
        if x == record:
            if kind == "KeyboardInterrupt":
                raise KeyboardInterrupt("pressed inside a map")
            if kind == "SystemExit(3)":
                raise SystemExit(3)
            if kind == "sys.exit(123)":
                import sys

                sys.exit(123)
            raise CustomBaseException("a BaseException of the user's own")
        return x

    return fn


def exit_on(record, code):
    def fn(x):
        if x == record:
            os._exit(code)
        return x

    return fn


def grow_at(record, nbytes):
    """Small results before ``record``, results of ``nbytes`` from it on."""

    def fn(x):
        size = nbytes if x >= record else 64
        return {"x": np.full(size, x % 256, dtype=np.uint8), "id": x}

    return fn


def numpy_draw(x):
    """The record and one draw of numpy's global generator in this process."""
    return {"x": x, "draw": int(np.random.randint(2**62)), "pid": os.getpid()}


def mark_each(marker_dir):
    """Leaves one file per record computed (to see which units have started)."""

    def fn(x):
        open(os.path.join(marker_dir, str(x)), "w").close()
        return x

    return fn


SHARED = {"the": "same object"}


def the_shared_object(x):
    """The module's one dict, whatever the record: a thread hands it over as itself."""
    return SHARED
