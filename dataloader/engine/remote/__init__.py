"""Executors whose workers are not children of the training process (Ray actors).

One rule for this room: its workers are one more implementation of the pool's worker-set
protocol (:class:`~dataloader.engine.pool.workers.Workers`), scheduled by the pool's one
loop (:class:`~dataloader.engine.pool.executor.PoolExecutor`): what differs is how a unit
reaches a worker and comes back, never how units are ordered, balanced, retried or
timed. Its client library is imported only by its own modules.
"""
