"""The engine a restore calls for: the loader's own, or one on an elastic layout.

A state saved after an elastic restore names its layout (``"elastic"``) and restores
only on an engine reading that layout; every old host's states (an
:class:`~dataloader.engine.restore.saved.OldHosts`) call for a new layout, computed by
:func:`~dataloader.engine.restore.layout.next_layout`. Either way the engine keeps the
loader's operations and kind of executor (:meth:`~dataloader.engine.executor.
ExecutorMaker.for_plan`) and reads an :class:`~dataloader.engine.restore.samplers.
ElasticSampler`; where the layout says that some outputs were used before the change,
its executors drop them (or hand out only their rest: a packer's cut element).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np

from dataloader.engine.plan import BATCH
from dataloader.engine.restore.layout import Layout, next_layout, span
from dataloader.engine.restore.protocol import Used
from dataloader.engine.restore.samplers import ElasticSampler, layout_of, order_of
from dataloader.engine.restore.saved import LoaderState, OldHosts
from dataloader.engine.state import made_for, resolve_state
from dataloader.errors import StateMismatchError
from dataloader.samplers import ShardOptions

# made_for fields an elastic restore keeps (it changes the host count and batch size only).
_KEPT = ("num_records", "shuffle", "seed", "num_epochs", "layout", "operations", "index_map")


def _check_fits(head: LoaderState, now: dict[str, Any]) -> None:
    saved = head.made_for
    differ = [f"{k}={saved.get(k)!r} but this loader has {k}={now.get(k)!r}" for k in _KEPT if saved.get(k) != now.get(k)]
    if differ:
        raise StateMismatchError(
            "this state does not fit the loader: it was saved for " + "; ".join(differ)
            + " (elastic restore changes the host count and batch size only)"
        )


def elastic_sampler(home: Any, hosts: OldHosts) -> ElasticSampler:
    """This host's share of what the old ``hosts`` left unread; ``home`` is the loader's
    own engine (the plain sharding of the new host count).

    Raises:
        StateMismatchError: the states were made for another data set, order or
            pipeline, or one is inside the outputs of an operation after the Batch.
    """
    now = made_for(home.plan)
    for host in hosts.hosts:
        _check_fits(host.head, now)
    for host in hosts.hosts:
        if host.head.state["skip"]:
            raise StateMismatchError(
                f"state of shard {host.shard} has skip={host.head.state['skip']}: it is inside "
                f"the outputs of an operation after the Batch, which an elastic restore cannot "
                f"split between hosts; save between batches"
            )
    sampler = home.plan.sampler
    base = order_of(sampler)
    end = base.with_shard_options(ShardOptions(0, 1)).num_positions
    read: list[tuple[int, list[Used]]] = []
    for host in hosts.by_shard():
        p, sub = host.head.cursor.position, host.head.cursor.sub_index
        begun = [(p, s, None) for s in range(sub)]  # a flat map's first outputs
        read.append((p, [*begun, *host.used]))
    layout = next_layout(Layout.from_state(hosts.hosts[0].head.elastic), hosts.count, read, end)
    return ElasticSampler(base, layout, sampler.shard_options)


def _rest(element: Any, offsets: dict[str, int]) -> Any:
    """The part of ``element`` a packer has not used: each feature from its offset on
    (a nested feature is named by its path, ``"a/b"``; a scalar is a length-1 sequence,
    as packers read it)."""
    rest = dict(element)
    for key, offset in offsets.items():
        start, stop = span(offset)
        if not start and stop is None:
            continue
        *path, leaf = key.split("/") if key not in rest else [key]
        node = rest
        for step in path:
            node[step] = dict(node[step])
            node = node[step]
        value = node[leaf]
        if np.ndim(value) == 0:
            value = np.atleast_1d(value)
        node[leaf] = value[start:stop]
    return rest


class SkippingExecutor:
    """An executor whose units lack what a layout says was used of their outputs."""

    def __init__(self, inner: Any, skips: dict[tuple[int, int], Any]) -> None:
        self._inner, self._skips = inner, skips
        self._positions = {q for q, _ in skips}

    def __iter__(self) -> SkippingExecutor:
        return self

    def __next__(self) -> Any:
        r = next(self._inner)
        if not r.outputs or not any(r.start <= q < r.stop for q in self._positions):
            return r
        pos, sub = r.tags()
        outputs, index = list(r.outputs), []
        for i, (q, s) in enumerate(zip(pos.tolist(), sub.tolist())):
            key = (q, s)
            if key not in self._skips:
                index.append(i)
            elif self._skips[key] is not None:
                outputs[i] = _rest(outputs[i], self._skips[key])
                index.append(i)
        keep = np.asarray(index, dtype=np.int64)
        digests = r.digests
        if digests is not None and len(digests) == len(r.outputs):
            digests = digests[keep]
        return dataclasses.replace(r, outputs=[outputs[i] for i in index], positions=pos[keep],
                                   subs=sub[keep], digests=digests)

    def reset(self, position: int) -> None:
        self._inner.reset(position)

    def start_prefetch(self) -> None:
        from dataloader.engine.executor import Prefetching

        if isinstance(self._inner, Prefetching):
            self._inner.start_prefetch()

    def close(self) -> None:
        self._inner.close()


def with_sampler(engine: Any, sampler: Any) -> Any:
    """``engine`` (a ``LoaderEngine``) reading ``sampler``: the same operations and kind of
    executor, on a plan whose sampler is ``sampler``; its executors drop what the
    sampler's layout says was used (``local_skips``)."""
    plan = dataclasses.replace(engine.plan, sampler=sampler)
    skips = sampler.local_skips
    wrap = (lambda executor: SkippingExecutor(executor, skips)) if skips else None
    # The fingerprint check stays on: a step's fingerprint names the outputs its layout
    # dropped ("dropped"), and the check drops them from what it recomputes.
    return dataclasses.replace(engine, plan=plan, make_executor=engine.make_executor.for_plan(plan, wrap))


def for_state(home: Any, current: Any, state: LoaderState) -> Any:
    """The engine ``state`` restores on: ``home`` (the loader's own, the plain sharding),
    ``current`` (the one the iterator runs, when it reads the state's layout already),
    or a new one on the layout the state names."""
    layout = state.elastic
    if layout is None:
        return home
    now = layout_of(current.plan.sampler)
    if now is not None and now.describe() == layout:
        return current
    sampler = ElasticSampler(home.plan.sampler, Layout.from_state(layout), home.plan.sampler.shard_options)
    return with_sampler(home, sampler)


def for_hosts(home: Any, hosts: OldHosts) -> tuple[Any, LoaderState | None]:
    """The engine every old host's states call for, and the state to restore on it
    (None: the engine's start).

    Hosts that all stopped at one batch boundary of a plain ``Batch``, with nothing held
    in a stage, keep the loader's single-state restore of the first state (the same
    global batches; ``drop_remainder`` sharding too); otherwise the engine reads the
    new layout from its start.
    """
    heads = [h.head for h in hosts.hosts]
    where = {(h.cursor, json.dumps(h.elastic)) for h in heads}
    if len(where) == 1 and not any(h.used for h in hosts.hosts) and heads[0].elastic is None \
            and home.plan.layout == BATCH:
        try:
            resolve_state(home.plan, heads[0].state)
            return home, heads[0]
        except StateMismatchError:
            pass  # another global batch size, or not at a global batch boundary
    return with_sampler(home, elastic_sampler(home, hosts)), None
