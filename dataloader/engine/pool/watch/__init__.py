"""Watching the workers: the progress board they write, and the stall watch that reads it.

:mod:`~dataloader.engine.pool.watch.progress` is the shared board (a worker writes which
unit and operation it is in; imported by the workers, so it stays light);
:mod:`~dataloader.engine.pool.watch.stalls` is the parent's reading of it (warnings,
timeouts) and the errors that name a stuck or crashing unit.
"""
