"""The progress board: what a worker writes in its slot is what the parent reads."""

from __future__ import annotations

import os
import time

from dataloader.engine.pool.watch.progress import SENDING, Board, Slot


def test_a_slot_reports_unit_stage_and_start_time_to_the_board():
    board = Board(3)
    try:
        assert board.read(1).generation == -1  # nothing started yet
        # The worker side maps the same memory through its own descriptor.
        slot = Slot(os.dup(board.fd), 1, 3)
        before = time.monotonic_ns()
        slot.begin(generation=4, unit=17)
        slot.stage(2)
        seen = board.read(1)
        assert (seen.generation, seen.unit, seen.stage) == (4, 17, 2)
        assert before <= seen.started_ns <= time.monotonic_ns()
        slot.stage(SENDING)
        assert board.read(1).stage == SENDING
        assert board.read(0).generation == board.read(2).generation == -1  # slots are apart
        board.clear(1)
        assert board.read(1).generation == -1
    finally:
        board.close()


def test_the_board_has_no_name_in_dev_shm_and_closes_its_descriptor():
    before = set(os.listdir("/dev/shm"))
    board = Board(2)
    assert set(os.listdir("/dev/shm")) == before
    fd = board.fd
    board.close()
    assert not os.path.exists(f"/proc/self/fd/{fd}")
