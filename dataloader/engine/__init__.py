"""The engine: work units, their computation, ordered assembly, states, and executors.

numpy and cloudpickle only; never JAX. See :mod:`dataloader.engine.plan` for the unit
model and :mod:`dataloader.engine.pool` for the worker processes.
"""
