"""How a pool's results travel back: shared-memory blocks lent per unit, else the pipe.

The parent lends a worker a block (from :class:`~dataloader.engine.pool.shm.BlockPool`)
with each task; the worker writes the pickled result and its numpy buffers into it, and
the parent rebuilds the result as views of the block, without a copy. A block is a
``memfd``: the first time a block is lent to a worker, its descriptor follows the task
on the worker's task socket (:meth:`Transport.lend` says which), and the task names
the blocks discarded since that worker's last task, which it unmaps.

Blocks are sized from the results seen. Before the first result the blocks are small
(:data:`~dataloader.engine.pool.shm.FIRST_SIZE`) and a worker grows the one it was lent
to fit its result, so the first results, computed by workers, travel in blocks as well;
the first size seen (with headroom) then sizes new blocks, and a larger result later
grows them again.

When blocks cannot be had, results travel pickled through the pipe instead (one more
copy, slower), and the loader warns once saying why and what to change: the system
has no ``memfd_create`` (not Linux), the memory left (the container's or the
machine's, checked when the first result fixes the size) cannot hold the blocks the
window needs, or a block cannot be made later.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

from dataloader.engine.pool import shm
from dataloader.engine.pool.messages import Done


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:.0f} MiB"


class Transport:
    """The result path of one pool: its block pool and whether it is in use."""

    def __init__(self) -> None:
        self.blocks = shm.BlockPool()
        self.use_shm = shm.memfd_available()
        self._told: dict[int, int] = {}  # worker key -> discarded blocks already told
        self._holds: dict[int, set[int]] = {}  # worker key -> blocks whose descriptor it has
        if not self.use_shm:
            self._fall_back("this system cannot make shared memory without a name (memfd_create, Linux 3.17+)")

    def _fall_back(self, why: str) -> None:
        self.use_shm = False
        warnings.warn(
            f"granary: {why}, so results travel through pipes (slower, one more copy); "
            f"lower worker_count or worker_buffer_size, or give the job more memory",
            RuntimeWarning,
            stacklevel=2,
        )

    def lend(self, worker: int) -> tuple[shm.Block | None, tuple[int, ...], tuple[int, ...]]:
        """A block for one task's result (or None: use the pipe), the blocks discarded
        since this worker's last task (it unmaps them), and the descriptors to send the
        worker after the task (the block's, the first time this worker gets it)."""
        block = None
        if self.use_shm:
            try:
                block = self.blocks.acquire()
            except OSError as exc:
                room = shm.block_room()
                self._fall_back(
                    f"a result block of {_mib(self.blocks.target_size)} could not be made "
                    f"({exc}; {'unknown memory' if room is None else _mib(room)} free)"
                )
        discarded = self.blocks.discarded
        holds = self._holds.setdefault(worker, set())
        # A worker's first task: it has mapped no block yet, so it has nothing to forget.
        told = self._told.get(worker, len(discarded))
        self._told[worker] = len(discarded)
        forget = tuple(i for i in discarded[told:] if i in holds)
        holds.difference_update(forget)
        fds: tuple[int, ...] = ()
        if block is not None and block.ident not in holds:
            holds.add(block.ident)
            fds = (block.fd,)
        return block, forget, fds

    def give_back(self, block: shm.Block | None) -> None:
        if block is not None:
            self.blocks.give_back(block)

    def receive(self, block: shm.Block | None, done: Done, message_bytes: int) -> Any:
        """The result of a :class:`Done` answer, as views of its block when it used one."""
        if done.layout is not None:
            assert block is not None, "a result in shared memory needs the block lent for it"
            if done.size > block.size:  # the worker grew the block to fit
                block.remap(done.size)
            value = shm.read_payload(self.blocks.lease(block), done.layout)
            size = done.size
        else:  # the result came pickled in the message itself
            self.give_back(block)
            value, size = done.result, message_bytes
        return value, size

    def take(self, block: shm.Block | None, done: Done, message_bytes: int, worker: int, blocks_needed: int) -> Any:
        """:meth:`receive`, then :meth:`note_size`; the result is marked for ``stats()``
        with who computed it, how it travelled and what receiving it cost."""
        began = time.perf_counter()
        value, size = self.receive(block, done, message_bytes)
        value.worker, value.piped = worker, done.layout is None
        value.timings["transport"] = time.perf_counter() - began
        self.note_size(size, blocks_needed)
        return value

    def note_size(self, nbytes: int, blocks_needed: int) -> None:
        """Grows the blocks to fit ``nbytes``; on the first size, checks the memory left
        has room for ``blocks_needed`` of them."""
        if not self.use_shm:
            return
        blocks = self.blocks
        first = not blocks.target_size
        blocks.note_payload(nbytes)
        if not first:
            return
        needed = blocks.target_size * blocks_needed
        room = shm.block_room()
        if room is not None and room < needed:
            self._fall_back(
                f"the memory left ({_mib(room)}) cannot hold the result blocks the buffers "
                f"need (about {_mib(needed)})"
            )

    def note_local_result(self, result: Any, blocks_needed: int) -> None:
        """Sizes the blocks from a result computed in this process (a warm-start unit)."""
        if self.use_shm and not self.blocks.target_size:
            self.note_size(shm.payload_size(*shm.dumps(result)), blocks_needed)

    def close(self) -> None:
        self.blocks.close()
