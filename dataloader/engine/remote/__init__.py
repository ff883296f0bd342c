"""Executors whose workers are not children of the training process (Ray actors).

One rule for this room: an executor here computes the plan's units with
:func:`~dataloader.engine.compute.compute_unit` somewhere else and hands them back in
unit order through the :class:`~dataloader.engine.executor.Executor` protocol, reusing
the pool's pure bookkeeping (:class:`~dataloader.engine.pool.window.Window`) and its
error payloads. Its client library is imported only by its own module.
"""
