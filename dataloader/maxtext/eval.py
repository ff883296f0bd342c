"""Eval across hosts: every host steps until the last host's last batch, by ``end="pad"``.

An eval pass keeps every sequence, so with several hosts one host may run out of
batches a step or two before another (its shard packed into fewer rows). A global
``jax.Array`` needs a batch from every process at every step. granary has one mechanism
for that, ``end="pad"`` (:func:`dataloader.end_together`): hosts agree through JAX's
key-value store every ``lookahead`` steps, with no device computation, so it is safe
behind the device feed's reader thread (see :mod:`dataloader.device.ends`).

:class:`EvalBatches` is that mechanism under the name MaxText users know (it was an
all-gather at every step before, which a device feed's thread cannot do safely). It only
adapts MaxText's layout: ``eval_dataset``'s batches already carry a ``mask`` of real rows
(the last batch is padded by the pipeline), so ``end="pad"``'s mask is folded into it: a
host that has run out gives an all-padding batch (every field zero, ``mask`` all false:
no loss, no metric), and all stop together when none has a batch. With one process
nothing is exchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from dataloader.engine.stages.finite import PADDED, Exchange, PadEnd
from dataloader.maxtext.format import KEYS

# end="pad"'s own mask while it passes through, folded into the batch's "mask".
_HOST_ROWS = "granary_end_rows"


def padding_batch(batch_size: int, length: int, mask_key: str = "mask") -> dict[str, np.ndarray]:
    """A batch of MaxText's layout in which no row is real."""
    out: dict[str, np.ndarray] = {key: np.zeros((batch_size, length), np.int32) for key in KEYS}
    out[mask_key] = np.zeros(batch_size, bool)
    return out


class EvalBatches(Iterator[dict[str, np.ndarray]]):
    """``end="pad"`` over MaxText's eval batches (see the module docstring).

    The same steps and padding as ``dl.end_together(batches, batch_size=batch_size,
    end=dl.PadEnd(example=padding_batch(...)))``, with its mask folded into the
    batches' own ``mask`` rather than added beside it.

    Args:
        batches: this host's padded eval batches (an ``eval_dataset`` iterator).
        batch_size: rows per host batch; length: ``max_target_length``.
        lookahead: steps between two exchanges (:class:`~dataloader.PadEnd`).
        exchange: makes the function hosts agree through (``PadEnd.exchange``); None:
            JAX's key-value store when there are several JAX processes.

    Example:
        >>> rows = [dict(padding_batch(2, 4), mask=np.ones(2, bool))]
        >>> [b["mask"].tolist() for b in EvalBatches(iter(rows), batch_size=2, length=4)]
        [[True, True]]
    """

    def __init__(self, batches: Iterator[Any], *, batch_size: int, length: int, lookahead: int = 8,
                 exchange: Callable[[], Exchange] | None = None) -> None:
        from dataloader.device.ends import end_together

        end = PadEnd(lookahead=lookahead, mask_key=_HOST_ROWS, example=padding_batch(batch_size, length),
                     exchange=exchange)
        self._steps = end_together(batches, batch_size=batch_size, end=end)

    def __iter__(self) -> EvalBatches:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        batch = next(self._steps)
        real = batch.pop(_HOST_ROWS)
        if not real.all():  # a padding batch (zeros, mask false) or padded rows
            batch["mask"] = np.asarray(batch["mask"], bool) & real
        return batch

    @property
    def padding_batches(self) -> int:
        """How many all-padding batches this host gave."""
        return int(self._steps.get_state()[PADDED])

    def close(self) -> None:
        """Closes the batches' iterator and ends a wait for the other hosts; idempotent."""
        self._steps.close()
