"""The exchange that lets hosts agree where finite data ends, on JAX's runtime.

:class:`~dataloader.engine.stages.finite.EndTogether` asks every ``lookahead`` steps how many
batches each host holds and whether its stream has ended (two integers a host). This
module answers through the **key-value store of JAX's distributed runtime** (the
coordinator that ``jax.distributed.initialize`` started): each host writes its two
integers under a key of its own and reads the others'. No device computation is
involved, so the exchange is safe from the device feed's reader thread while the
training step runs its own collectives in the main thread, in whatever order the hosts
interleave them (a ``process_allgather`` from that thread is a collective on the
devices, which two threads may launch in different orders on different hosts). One
exchange costs one write and ``H - 1`` reads at the coordinator.

Keys are ``granary/end/<iterator>/<generation>/<round>/<host>``: iterators are numbered
in the order a process makes them and generations count ``set_state`` calls, both the
same on every host of an SPMD program, so a restore never reads a round posted before
it. A host deletes its own key two rounds later, when every host has read it.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import numpy as np

from dataloader.engine.stages.finite import EndTogether, resolve_end, static_steps

_iterators = itertools.count()


class KeyValueExchange:
    """``exchange(values)``: every JAX process's int vector, through the runtime's store.

    Args:
        timeout_s: how long to wait for another host's answer before raising.
        poll_s: the wait is cut in slices of this many seconds, so that :meth:`close`
            (another thread) ends it promptly.
        client, process_index, process_count: the store's client (``key_value_set``,
            ``blocking_key_value_get``, ``key_value_delete``) and this process's place;
            None: JAX's (``jax.distributed``). For tests.
        name: the keys' prefix, the same on every host; None: numbered in the order
            this process makes exchanges (the same order on every host of an SPMD program).
    """

    def __init__(self, *, timeout_s: float = 600.0, poll_s: float = 0.5, client: Any = None,
                 process_index: int | None = None, process_count: int | None = None,
                 name: str | None = None) -> None:
        if client is None:
            import jax
            from jax._src import distributed

            client = distributed.global_state.client
            process_index, process_count = jax.process_index(), jax.process_count()
        self._client: Any = client
        self._index, self._count = int(process_index or 0), int(process_count or 1)
        if self._client is None and self._count > 1:
            raise RuntimeError(
                "JAX's distributed runtime has no client; call jax.distributed.initialize() "
                "before making the iterator"
            )
        self._name = name if name is not None else f"granary/end/{next(_iterators)}"
        self._generation = 0
        self._round = 0
        self._timeout_s, self._poll_ms = timeout_s, max(1, int(poll_s * 1000))
        self._closed = False

    def reset(self) -> None:
        """A new generation of rounds (every host restores at the same step)."""
        self._generation += 1
        self._round = 0

    def close(self) -> None:
        self._closed = True

    def _key(self, round_: int, host: int) -> str:
        return f"{self._name}/{self._generation}/{round_}/{host}"

    def __call__(self, values: np.ndarray) -> np.ndarray:
        mine = np.asarray(values, np.int64).ravel()
        if self._count == 1:
            return mine[None, :]
        round_ = self._round
        self._round += 1
        self._client.key_value_set(self._key(round_, self._index), ",".join(map(str, mine.tolist())))
        rows = []
        for host in range(self._count):
            if host == self._index:
                rows.append(mine)
                continue
            rows.append(np.asarray(self._wait(self._key(round_, host), host).split(","), np.int64))
        if round_ >= 2:
            self._client.key_value_delete(self._key(round_ - 2, self._index))
        return np.stack(rows)

    def _wait(self, key: str, host: int) -> str:
        deadline = time.monotonic() + self._timeout_s
        while True:
            try:
                return str(self._client.blocking_key_value_get(key, self._poll_ms))
            except Exception as exc:  # the runtime's deadline error has no class of its own
                if "DEADLINE" not in str(exc).upper():
                    raise
            if self._closed:
                raise StopIteration
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f'end="pad": host {host} did not say within {self._timeout_s:.0f} s whether '
                    f"its data has ended ({key}); is it still iterating the same pipeline?"
                )


def end_together(iterator: Any, *, batch_size: int, end: Any = "pad",
                 sampler: Any = None, drop_remainder: bool = False) -> EndTogether:
    """Pads ``iterator``'s batches so every JAX process stops on the same step.

    For any iterator of dict batches (a dataset's, a mixture's); a ``DataLoader`` does
    this itself with ``end="pad"``. With ``sampler`` (a plain batch of ``batch_size``
    over it, no filter or flat map) the step count is computed; otherwise the processes
    agree on it through ``end.exchange`` when the :class:`~dataloader.PadEnd` gives one,
    else through JAX's runtime (:class:`KeyValueExchange`) when there are several.

    Args:
        iterator: this process's batches.
        batch_size: rows per process batch.
        end: ``"pad"`` or a :class:`~dataloader.PadEnd`.
        sampler: the sampler of a plain batch, to compute the step count.
        drop_remainder: that batch's ``drop_remainder``.
    """
    settings = resolve_end(end)
    if settings is None:
        raise ValueError('end_together needs end="pad" or a dl.PadEnd(...), got None')
    steps = static_steps(sampler, batch_size, drop_remainder) if sampler is not None else None
    exchange = None
    if steps is None and settings.exchange is not None:
        exchange = settings.exchange()
    elif steps is None:
        import jax

        exchange = KeyValueExchange() if jax.process_count() > 1 else None
    return EndTogether(iterator, batch_size=batch_size, end=settings, steps=steps, exchange=exchange)

