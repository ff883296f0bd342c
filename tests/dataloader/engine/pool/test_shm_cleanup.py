"""Blocks of a dead training process are unlinked by whoever outlives it, and only then."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from dataloader.engine.pool import shm


def _block(name: str) -> str:
    path = os.path.join(shm.SHM_DIR, name)
    with open(path, "wb") as f:
        f.write(b"x")
    return path


def test_blocks_of_a_live_owner_are_left_alone():
    path = _block(f"granary_test_live_{os.getpid()}_0")
    try:
        assert shm.unlink_if_orphaned(f"granary_test_live_{os.getpid()}_", os.getpid()) == 0
        assert os.path.exists(path)
    finally:
        os.unlink(path)


def test_a_dying_owner_is_waited_for_and_its_blocks_unlinked():
    # The owner still runs when the cleanup starts (as a killed process does while it
    # closes its descriptors): with wait_s the blocks go once it is gone.
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    head = f"granary_test_dying_{owner.pid}_"
    paths = [_block(f"{head}{i}") for i in range(2)]
    try:
        assert shm.unlink_if_orphaned(head, owner.pid) == 0  # alive: not taken
        started = time.monotonic()
        # It ends as a zombie (not reaped here), which counts as gone.
        assert shm.unlink_if_orphaned(head, owner.pid, wait_s=10.0) == 2
        assert time.monotonic() - started < 5.0
        assert not any(os.path.exists(p) for p in paths)
    finally:
        owner.wait()
        for p in paths:
            if os.path.exists(p):
                os.unlink(p)


def test_an_owner_that_outlives_the_wait_keeps_its_blocks():
    path = _block(f"granary_test_wait_{os.getpid()}_0")
    try:
        started = time.monotonic()
        assert shm.unlink_if_orphaned(f"granary_test_wait_{os.getpid()}_", os.getpid(), wait_s=0.2) == 0
        assert 0.2 <= time.monotonic() - started < 2.0
        assert os.path.exists(path)
    finally:
        os.unlink(path)
