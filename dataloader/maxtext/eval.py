"""Eval across hosts: every host steps until the last host's last batch.

An eval pass keeps every sequence, so with several hosts one host may run out of
batches a step or two before another (its shard packed into fewer rows). A global
``jax.Array`` needs a batch from every process at every step, so :class:`EvalBatches`
asks all processes, each step, whether any still has a batch (one small all-gather);
a host that has none gives an all-padding batch (``mask`` all false, segmentation 0:
no loss, no metric), and all stop together when none has. With one process nothing is
exchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from dataloader.maxtext.format import KEYS


def padding_batch(batch_size: int, length: int, mask_key: str = "mask") -> dict[str, np.ndarray]:
    """A batch of MaxText's layout in which no row is real."""
    out: dict[str, np.ndarray] = {key: np.zeros((batch_size, length), np.int32) for key in KEYS}
    out[mask_key] = np.zeros(batch_size, bool)
    return out


def _any_process(has_batch: bool) -> bool:
    """Whether any JAX process has a batch (an all-gather of one flag per process)."""
    from jax.experimental import multihost_utils

    flags = multihost_utils.process_allgather(np.asarray([int(has_batch)], np.int32))
    return bool(np.asarray(flags).any())


class EvalBatches(Iterator[dict[str, np.ndarray]]):
    """Steps every host's eval stream together (see the module docstring).

    Args:
        batches: this host's padded eval batches (an ``eval_dataset`` iterator).
        batch_size: rows per host batch; length: ``max_target_length``.
        process_count: JAX processes (default: ``jax.process_count()``).
        any_process: how to ask whether any process has a batch (default: an
            all-gather over JAX processes).
    """

    def __init__(self, batches: Iterator[Any], *, batch_size: int, length: int,
                 process_count: int | None = None,
                 any_process: Callable[[bool], bool] | None = None) -> None:
        if process_count is None:
            import jax

            process_count = jax.process_count()
        self._batches = batches
        self._padding = padding_batch(batch_size, length)
        self._alone = process_count == 1 and any_process is None
        self._any = any_process or _any_process
        self._done = False
        self.padding_batches = 0  # how many this host filled in

    def __iter__(self) -> EvalBatches:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        batch = None
        if not self._done:
            try:
                batch = next(self._batches)
            except StopIteration:
                self._done = True
        if self._alone:
            if batch is None:
                raise StopIteration
            return batch
        if not self._any(batch is not None):
            raise StopIteration
        if batch is None:
            self.padding_batches += 1
            return {k: v.copy() for k, v in self._padding.items()}
        return batch

    def close(self) -> None:
        close = getattr(self._batches, "close", None)
        if close is not None:
            close()
