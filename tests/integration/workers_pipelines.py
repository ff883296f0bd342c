"""Operations used by the worker tests (importable by child processes)."""

from __future__ import annotations

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
