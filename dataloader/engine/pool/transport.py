"""How a pool's results travel back: shared-memory blocks lent per unit, else the pipe.

The parent lends a worker a block (from :class:`~dataloader.engine.pool.shm.BlockPool`)
with each task; the worker writes the pickled result and its numpy buffers into it, and
the parent rebuilds the result as views of the block, without a copy. Blocks are sized
from the results seen: the first result (usually a warm-start unit computed in the parent)
fixes the size, with headroom, and a larger result later grows new blocks.

When ``/dev/shm`` is missing or too small for the blocks the window needs (checked
when the first result fixes the size), or a block cannot be made later (a larger result
grows the blocks past what ``/dev/shm`` has left), results travel pickled through the
pipe instead (one more copy, slower), and the loader warns once saying why and what to
change.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

from dataloader.engine.pool import shm
from dataloader.engine.pool.messages import Done


class Transport:
    """The result path of one pool: its block pool and whether it is in use."""

    def __init__(self) -> None:
        self.blocks = shm.BlockPool()
        self.use_shm = shm.shm_available()
        self._told: dict[int, int] = {}  # worker key -> discarded names already told
        if not self.use_shm:
            self._fall_back(f"{shm.SHM_DIR} is not available")
        else:
            shm.sweep_stale_blocks()

    @property
    def prefix(self) -> str:
        """The names of this pool's blocks start with it (workers clean up by it)."""
        return self.blocks.prefix

    def _fall_back(self, why: str) -> None:
        self.use_shm = False
        warnings.warn(
            f"granary: {why}, so results travel through pipes (slower, one more copy); "
            f"enlarge /dev/shm (e.g. docker --shm-size=2g) or lower worker_count or "
            f"worker_buffer_size",
            RuntimeWarning,
            stacklevel=2,
        )

    def lend(self, worker: int) -> tuple[shm.Block | None, tuple[str, ...]]:
        """A block for one task's result (or None: use the pipe), and the names of blocks
        discarded since this worker's last task (it unmaps them)."""
        block = None
        if self.use_shm:
            try:
                block = self.blocks.acquire()
            except OSError as exc:
                self._fall_back(
                    f"a result block of {self.blocks.target_size / 2**20:.1f} MiB could not be "
                    f"made in {shm.SHM_DIR} ({exc}; "
                    f"{shm.shm_free_bytes() / 2**20:.0f} MiB free)"
                )
        discarded = self.blocks.discarded
        # A worker's first task: it has mapped no block yet, so it has nothing to forget.
        told = self._told.get(worker, len(discarded))
        self._told[worker] = len(discarded)
        return block, tuple(discarded[told:])

    def give_back(self, block: shm.Block | None) -> None:
        if block is not None:
            self.blocks.give_back(block)

    def receive(self, block: shm.Block | None, done: Done, message_bytes: int) -> Any:
        """The result of a :class:`Done` answer, as views of its block when it used one."""
        if done.layout is not None:
            assert block is not None, "a result in shared memory needs the block lent for it"
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
        """Grows the blocks to fit ``nbytes``; on the first size, checks /dev/shm has room
        for ``blocks_needed`` of them."""
        if not self.use_shm:
            return
        blocks = self.blocks
        first = not blocks.target_size
        blocks.note_payload(nbytes)
        if not first:
            return
        needed = blocks.target_size * blocks_needed
        free = shm.shm_free_bytes()
        if free < needed:
            self._fall_back(
                f"{shm.SHM_DIR} has {free / 2**20:.0f} MiB free but the buffers need about "
                f"{needed / 2**20:.0f} MiB"
            )

    def note_local_result(self, result: Any, blocks_needed: int) -> None:
        """Sizes the blocks from a result computed in this process (a warm-start unit)."""
        if self.use_shm and not self.blocks.target_size:
            self.note_size(shm.payload_size(*shm.dumps(result)), blocks_needed)

    def close(self) -> None:
        self.blocks.close()
