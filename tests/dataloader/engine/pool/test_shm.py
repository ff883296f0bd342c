"""Result blocks: memory without a name, reused, grown by a worker, results rebuilt as views."""

from __future__ import annotations

import gc
import os
import pickle
import re
import socket
import stat

import numpy as np
import pytest

from dataloader.engine.pool import shm
from dataloader.engine.pool.watch.progress import Board
from dataloader.engine.shipped_inputs import ShippedInputs, write_elements
from tests.helpers import memfds


def _roundtrip(pool: shm.BlockPool, value):
    """Writes ``value`` as a worker does (through a descriptor of the block) and reads it
    back as the parent does; returns the rebuilt value and the block."""
    block = pool.acquire()
    mapped = shm.Mapped(os.dup(block.fd))
    header, buffers = shm.dumps(value)
    size = shm.payload_size(header, buffers)
    assert mapped.fit(size)
    layout = shm.write_payload(mapped.mmap, header, buffers)
    mapped.close()
    if size > block.size:
        block.remap(size)
    return shm.read_payload(pool.lease(block), layout), block


def test_results_come_back_identical_as_views_of_the_block():
    pool = shm.BlockPool()
    pool.note_payload(1 << 20)
    value = {
        "image": np.arange(3 * 32 * 32, dtype=np.uint8).reshape(3, 32, 32),
        "labels": [np.int64(7), np.array([1.5, -2.0])],
        "text": ("a", b"b", None),
        "nested": {"deep": [np.ones((4, 5), np.float32)]},
    }
    got, _ = _roundtrip(pool, value)
    np.testing.assert_array_equal(got["image"], value["image"])
    assert got["labels"][0] == 7
    np.testing.assert_array_equal(got["labels"][1], value["labels"][1])
    assert got["text"] == ("a", b"b", None)
    np.testing.assert_array_equal(got["nested"]["deep"][0], value["nested"]["deep"][0])
    assert not got["image"].flags.owndata  # a view of the block, not a copy
    pool.close()


def test_numpy_scalars_come_back_with_their_type_and_bits():
    """Scalars pickled as their Python values (the fast path) and those left to numpy's
    own reduce come back the same type with the same bytes, edge values included."""
    import copyreg

    values = [np.bool_(True), np.int8(-128), np.uint16(65535), np.int32(-7), np.int64(-2**63),
              np.uint64(2**64 - 1), np.float64("nan"), np.float64(-0.0), np.float64(np.inf),
              np.complex128(1 - 2j), np.float32(1.5), np.float16(-2), np.longdouble(1) / 3,
              np.datetime64("2020-01-01"), np.str_("x"), np.array(5)]
    header, buffers = shm.dumps(values)
    back = pickle.loads(header, buffers=buffers)
    for sent, got in zip(values, back, strict=True):
        assert type(got) is type(sent)
        assert np.asarray(got).tobytes() == np.asarray(sent).tobytes()
    # np.int64 went by its value, not as numpy's (dtype, raw bytes): shorter, and half the time
    assert len(shm.dumps(np.int64(5))[0]) < len(pickle.dumps(np.int64(5), protocol=5))

    class Later:  # a reducer registered with copyreg after import is still used
        pass

    copyreg.pickle(Later, lambda obj: (int, (3,)))
    try:
        assert pickle.loads(shm.dumps(Later())[0]) == 3
    finally:
        del copyreg.dispatch_table[Later]


def test_blocks_have_no_name_in_dev_shm():
    before = set(os.listdir("/dev/shm"))
    pool = shm.BlockPool()
    pool.note_payload(1 << 16)
    block = pool.acquire()
    assert os.readlink(f"/proc/self/fd/{block.fd}").startswith("/memfd:granary-result-")
    assert set(os.listdir("/dev/shm")) <= before
    pool.close()


def test_a_block_is_reused_once_no_array_views_it():
    pool = shm.BlockPool()
    pool.note_payload(1 << 16)
    got, block = _roundtrip(pool, np.arange(100))
    assert pool.acquire() is not block  # leased: the pool makes another
    del got
    gc.collect()
    assert pool.acquire() is block  # the finalizer gave it back
    pool.close()


def test_a_worker_grows_a_small_block_to_fit_a_large_result():
    pool = shm.BlockPool()
    # No result seen yet: blocks are small, and the first large result grows its block.
    large = np.random.default_rng(0).random(3 * 2**20 // 8)  # 3 MiB
    got, block = _roundtrip(pool, large)
    assert block.size >= large.nbytes > shm.FIRST_SIZE
    np.testing.assert_array_equal(got, large)
    del got
    gc.collect()
    pool.note_payload(large.nbytes)
    # A block sized before is discarded (workers are told to unmap it), and new ones fit.
    small_pool_block = pool.acquire()
    assert small_pool_block.size >= large.nbytes
    pool.close()


def test_a_worker_maps_a_block_that_another_worker_grew():
    pool = shm.BlockPool()
    block = pool.acquire()
    first, second = shm.Mapped(os.dup(block.fd)), shm.Mapped(os.dup(block.fd))
    assert first.fit(1 << 20)  # grows the block
    assert len(second.mmap) == shm.FIRST_SIZE
    assert second.fit(1 << 20)  # maps it again, grows nothing
    assert len(second.mmap) == len(first.mmap) == os.fstat(block.fd).st_size
    first.close()
    second.close()
    pool.close()


def test_a_result_larger_than_the_memory_left_is_refused_not_a_sigbus(monkeypatch):
    def no_room(fd, offset, size):
        raise OSError(28, "No space left on device")

    pool = shm.BlockPool()
    block = pool.acquire()
    mapped = shm.Mapped(os.dup(block.fd))
    monkeypatch.setattr(os, "posix_fallocate", no_room)
    assert not mapped.fit(1 << 20)  # the worker sends the result through the pipe
    assert len(mapped.mmap) == shm.FIRST_SIZE
    with pytest.raises(OSError, match="No space"):
        shm.Block(99, 1 << 20)
    mapped.close()
    pool.close()


def test_a_descriptor_passed_over_a_socket_maps_the_same_memory():
    pool = shm.BlockPool()
    block = pool.acquire()
    ours, theirs = socket.socketpair()
    socket.send_fds(ours, [b"\0"], [block.fd])
    _, fds, _, _ = socket.recv_fds(theirs, 1, 1)
    mapped = shm.Mapped(fds[0])
    mapped.mmap[:5] = b"hello"
    assert block.mmap[:5] == b"hello"
    mapped.close()
    ours.close()
    theirs.close()
    pool.close()


def test_block_room_is_bounded_by_memory_not_by_dev_shm(monkeypatch):
    """Against the machine's total memory, which other processes do not move (its
    MemAvailable, read a moment after the room, moved under a busy machine's tests)."""
    tiny = os.statvfs_result((4096, 4096, 256, 256, 256, 0, 0, 0, 0, 255))  # a 1 MiB /dev/shm
    monkeypatch.setattr(os, "statvfs", lambda path: tiny)
    room = shm.block_room()
    with open("/proc/meminfo") as f:
        total = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal:"))
    assert room is not None and 1 << 20 < room <= total


@pytest.mark.parametrize(("host_available", "memory_room", "room"), [
    (7 << 30, 3 << 30, 3 << 30),  # the container leaves less than the machine
    (2 << 30, 5 << 30, 2 << 30),  # the machine leaves less than the container's limit
    (2 << 30, None, 2 << 30),  # no container limit
    (None, None, None),  # nothing readable: unknown, not zero
])
def test_block_room_is_what_memory_leaves_not_dev_shm(monkeypatch, host_available, memory_room, room):
    """The room is one reading of the memory the machine and the container leave.

    The limits are fixed here: the machine's own MemAvailable moves with every other
    process between two readings, so a test comparing two of them fails on a busy machine.
    """
    from dataloader.engine.pool.autoscale import limits

    fixed = limits.Limits(host_available=host_available, memory_room=memory_room, host_total=64 << 30)
    monkeypatch.setattr(limits, "read_limits", lambda: fixed)
    assert shm.block_room() == room


def test_closing_the_pool_closes_every_descriptor():
    pool = shm.BlockPool()
    fds = [pool.acquire().fd for _ in range(3)]
    pool.close()
    assert all(not os.path.exists(f"/proc/self/fd/{fd}") or not os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:granary")
               for fd in fds)
    assert pool.acquire() is None


def test_every_memfd_the_engine_makes_is_readable_by_its_owner_only():
    """memfd_create makes mode 0777; without /proc's own 0500 on fd folders another user
    could open a result block through /proc/<pid>/fd. Each kind the engine makes is 0600."""
    before = set(memfds())
    pool = shm.BlockPool()
    pool.acquire()
    board = Board(2)
    fd, _ = write_elements(["a", np.arange(3)])
    inputs = ShippedInputs(4, shared=True)
    try:
        made = {fd: name for fd, name in memfds().items() if fd not in before}
        kinds = {re.sub(r"(-\d+)? \(deleted\)$", "", name) for name in made.values()}
        assert kinds == {"/memfd:granary-result", "/memfd:granary-progress", "/memfd:granary-inputs",
                         "/memfd:granary-input-table"}, kinds
        modes = {name: oct(stat.S_IMODE(os.fstat(fd).st_mode)) for fd, name in made.items()}
        assert set(modes.values()) == {"0o600"}, modes
    finally:
        os.close(fd)
        inputs.close()
        board.close()
        pool.close()
