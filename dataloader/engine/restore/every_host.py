"""The entry point of an elastic restore: every old host's states into one pipeline.

``iterator.set_state([...])`` on any :class:`~dataloader.DatasetIterator` comes here (the
base class routes a list or tuple of states to :func:`restore_every_host`; so do
``DataLoader.iterator(states)``, ``ElasticIterator.set_shard_states`` and an Orbax
restore on another process count). In order, and nothing moves before the last check:

1. the chain of stages from the iterator down to the engine's iterator, each checked
   once for the protocol (:func:`~dataloader.engine.restore.protocol.chain_of`): a stage
   that cannot take part is refused by name;
2. each old state parsed once, taken apart by those stages
   (:class:`~dataloader.engine.restore.saved.OldHosts`);
3. the engine's iterator computes and checks what it will read (the new layout, the
   old hosts' fingerprints), :meth:`~dataloader.engine.restore.protocol.ElasticHead.
   prepare_hosts`;
4. the stages restart, top down, each moving its parent first and starting empty.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from dataloader.engine.restore.protocol import chain_of
from dataloader.engine.restore.saved import OldHosts


def restore_every_host(top: Any, states: Sequence[Any]) -> None:
    """Restarts the pipeline under ``top`` on this host's share of what every old host
    (``states``, one each, any order) left unread: each record once across the change.

    Raises:
        StateMismatchError: a stage that cannot take part (named), a state that does not
            fit, or states that are not one per old host of one step.
    """
    states = list(states)
    chain = chain_of(top, len(states))
    hosts = OldHosts.parse(chain, states)
    move = chain[-1].prepare_hosts(hosts)

    def resume_from(k: int) -> Callable[[], None]:
        if k == len(chain) - 1:
            return move
        return lambda: chain[k].restart_elastic(resume_from(k + 1), hosts.kept(k))

    resume_from(0)()
