"""The transport: which descriptors follow a task, what a worker forgets, how it falls back."""

from __future__ import annotations

import os

import numpy as np
import pytest

from dataloader.engine.compute import UnitResult
from dataloader.engine.pool import shm
from dataloader.engine.pool.messages import Done
from dataloader.engine.pool.transport import Transport


def test_a_block_descriptor_is_sent_to_each_worker_once():
    transport = Transport()
    block, forget, fds = transport.lend(worker=1)
    assert block is not None and fds == (block.fd,) and forget == ()
    transport.give_back(block)
    again, _, fds = transport.lend(worker=1)
    assert again is block and fds == ()  # worker 1 holds it already
    transport.give_back(again)
    other, _, fds = transport.lend(worker=2)
    assert other is block and fds == (block.fd,)  # worker 2 does not
    transport.close()


def test_a_worker_is_told_to_forget_only_discarded_blocks_it_holds():
    transport = Transport()
    held, _, _ = transport.lend(worker=1)
    unseen, _, _ = transport.lend(worker=2)
    transport.give_back(held)
    transport.give_back(unseen)
    transport.blocks.note_payload(1 << 20)  # both blocks are now too small
    fresh, forget, fds = transport.lend(worker=1)
    assert fresh not in (held, unseen) and fds == (fresh.fd,)
    assert forget == (held.ident,)  # not the block worker 1 never mapped
    _, forget, _ = transport.lend(worker=1)
    assert forget == ()  # told once
    transport.close()


def test_a_result_in_a_block_the_worker_grew_is_read_whole():
    transport = Transport()
    block, _, _ = transport.lend(worker=1)
    value = UnitResult(0, 1, [np.arange(2**18, dtype=np.int64)])
    header, buffers = shm.dumps(value)
    size = shm.payload_size(header, buffers)
    mapped = shm.Mapped(os.dup(block.fd))
    assert size > block.size and mapped.fit(size)
    layout = shm.write_payload(mapped.mmap, header, buffers)
    mapped.close()
    got = transport.take(block, Done(0, 0, layout, size, None), 100, worker=0, blocks_needed=4)
    np.testing.assert_array_equal(got.outputs[0], value.outputs[0])
    assert not got.piped and transport.blocks.target_size >= size
    transport.close()


def test_without_memfd_results_take_the_pipe_with_a_warning(monkeypatch):
    monkeypatch.delattr(os, "memfd_create")
    with pytest.warns(RuntimeWarning, match="memfd_create.*results travel through pipes"):
        transport = Transport()
    assert not transport.use_shm
    assert transport.lend(worker=1) == (None, (), ())
    transport.close()


def test_memory_too_small_for_the_blocks_falls_back_to_the_pipe(monkeypatch):
    monkeypatch.setattr(shm, "block_room", lambda: 10 * 2**20)
    transport = Transport()
    with pytest.warns(RuntimeWarning, match=r"memory left \(10 MiB\) cannot hold .*\(about 1\d\d MiB"):
        transport.note_size(8 * 2**20, blocks_needed=12)
    assert transport.lend(worker=1)[0] is None
    transport.close()
