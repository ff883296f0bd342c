"""The worker processes of one pool: starting, replacing, retiring and reaping them."""

from __future__ import annotations

import logging
import os

from dataloader.engine.pool import zygote as fork_server
from dataloader.engine.pool.process import WorkerProcess, startup_cpus, stop_all, worker_env
from dataloader.engine.pool.progress import Board
from dataloader.engine.pool.transport import Transport

logger = logging.getLogger("dataloader")


class _Resources:
    """What must be released whatever happens: the processes, the blocks, the board."""

    def __init__(self, worker_count: int, plan_bytes: bytes) -> None:
        self.workers: list[WorkerProcess] = []
        self.retired: list[WorkerProcess] = []  # stopped by the autoscaler, not yet reaped
        self.transport = Transport()
        self.zygote: fork_server.Zygote | None = None
        if fork_server.ENABLED:
            try:
                self.zygote = fork_server.Zygote(
                    fork_server.preload_modules(plan_bytes),
                    self.transport.prefix,
                    os.sched_getaffinity(0),
                    worker_env(),
                    startup_cpus(),
                )
            except OSError as exc:  # no fork server: every worker starts an interpreter
                logger.warning("granary: no fork server (%s); workers start one by one", exc)
        try:
            self.board: Board | None = Board(worker_count)
        except OSError as exc:  # no memfd (not Linux, or an old kernel): no stall checks
            logger.warning("granary: no progress board (%s); stuck workers go unnoticed", exc)
            self.board = None


def _release(res: _Resources) -> None:
    """Stops every child within a bounded time and unlinks every block."""
    stop_all([*res.workers, *res.retired])
    res.workers.clear()
    res.retired.clear()
    if res.zygote is not None:
        res.zygote.close()
    res.transport.close()
    if res.board is not None:
        res.board.close()
