"""Elastic restore for every pipeline: what the hosts of a new host count read next.

The global stream is positions ``g = 0, 1, 2, ...`` (docs/design.md, "The global stream"). A
*layout* says which of them are still to be read, as a finite sorted set ``E`` (the
leftovers) and everything from a frontier ``F`` on, and how ``H`` hosts share them:
the unread positions in order, ``U = sorted(E) + [F, F+1, ...]``, are dealt out
round-robin, so host ``h`` reads ``U[h], U[h+H], U[h+2H], ...``. The plain sharding is
the layout with ``E`` empty and ``F = 0`` (host ``h`` reads ``g % H == h``).

After some steps host ``h`` has used its first ``p_h`` positions (its state's
``position``; with a flat map, also ``sub_index`` outputs of position ``p_h``). Given
every old host's state, :func:`next_layout` computes the layout of what nobody used:

* ``T = max_h (h + H * p_h)``: every index ``i >= T`` of ``U`` is unread, so ``U[T:]`` is
  the new tail (the new frontier is ``F + T - |E|`` when ``T >= |E|``; otherwise the old
  leftovers ``E[T:]`` stay leftovers and the frontier stays ``F``);
* the positions below ``T`` that a host had not reached (``U[i]`` for ``i`` in host
  ``h``'s class, ``h + H * p_h <= i < T``) become leftovers;
* a position a host had begun (``sub_index > 0`` after a flat map) is a leftover that
  keeps how many of its outputs were used (``partial``): whichever new host reads it
  drops those outputs and hands out the rest.

The new ``H'`` hosts read the new ``U'`` round-robin: first the leftovers in global
order, then the positions above the frontier, interleaved. Every record of the stream
is thus read exactly once across any number of changes, and the restore is O(1) in the
stream position: the layout is stored as arithmetic progressions ``[start, step,
count]``, one per host whose reading stopped below ``T`` in the usual case (a save
after every new host read past the leftovers), so a state stays O(H) numbers and a
chain of restores (1 -> 2 -> 3 -> 1) does not grow it.

:class:`ElasticSampler` reads one host's share of a layout; it is a
:class:`~dataloader.samplers.Sampler`, so filters, flat maps, mixtures, random maps
(keyed by the global position), workers and units all run on it unchanged.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from dataloader.errors import StateMismatchError
from dataloader.samplers import ShardOptions


def _runs(values: np.ndarray) -> list[list[int]]:
    """Increasing ``values`` as maximal arithmetic progressions ``[start, step, count]``."""
    out: list[list[int]] = []
    i, n = 0, len(values)
    while i < n:
        if i + 1 == n:
            out.append([int(values[i]), 1, 1])
            break
        step = int(values[i + 1] - values[i])
        j = i + 1
        while j + 1 < n and int(values[j + 1] - values[j]) == step:
            j += 1
        out.append([int(values[i]), step, j - i + 1])
        i = j + 1
    return out


def _expand(runs: Iterable[Sequence[int]]) -> np.ndarray:
    parts = [s + d * np.arange(c, dtype=np.int64) for s, d, c in runs if c > 0]
    return np.sort(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)


def _span(value: Any) -> tuple[int, int | None]:
    """A feature's unused rest: an offset ``start`` (to its end) or ``[start, stop]``."""
    if isinstance(value, (list, tuple)):
        return int(value[0]), int(value[1])
    return int(value), None


def _merge(old: Any, new: Any) -> Any:
    """What is used of one output after two saves: ``None`` (all of it) or, per feature,
    where its unused rest starts (or ``[start, stop]``: a first/best-fit element whose
    first and last pieces were used); ``new`` is measured on the rest ``old`` left."""
    if old is None or new is None:
        return None
    out: dict[str, Any] = {}
    for k in {*old, *new}:
        (a, b), (c, d) = _span(old.get(k, 0)), _span(new.get(k, 0))
        stop = b if d is None else a + d if b is None else min(b, a + d)
        out[k] = a + c if stop is None else [a + c, stop]
    return out


class Layout:
    """The unread part of a global stream: leftovers ``E``, a frontier ``F``, and what
    was used of outputs of unread positions.

    Args:
        frontier: ``F``, every global position from it on is unread.
        extra: ``E`` as arithmetic progressions ``[start, step, count]`` below ``F``.
        partial: ``[g, sub, used]`` triples: output ``sub`` of position ``g`` (its rank
            after a flat map; 0 without one) was used, all of it (``used`` is None) or
            up to the offsets ``used = {feature: offset}`` (a concat-then-split row
            took its first tokens). Whichever host reads ``g`` drops the output, or
            hands out its rest.
    """

    def __init__(self, frontier: int = 0, extra: Sequence[Sequence[int]] = (),
                 partial: Sequence[Sequence[Any]] = ()) -> None:
        self.frontier = int(frontier)
        self.extra = [[int(s), int(d), int(c)] for s, d, c in extra if int(c) > 0]
        self.partial: dict[tuple[int, int], Any] = {}
        for g, sub, used in partial:
            self.partial[int(g), int(sub)] = None if used is None else {
                str(k): [int(v[0]), int(v[1])] if isinstance(v, (list, tuple)) else int(v) for k, v in dict(used).items()
            }
        self.leftovers = _expand(self.extra)
        if len(np.unique(self.leftovers)) != len(self.leftovers) or (
            len(self.leftovers) and (self.leftovers[0] < 0 or self.leftovers[-1] >= self.frontier)
        ):
            raise StateMismatchError(
                f"state field elastic={self.describe()} is invalid: expected leftovers that are "
                f"distinct positions in [0, frontier); pass the states get_state() returned, unchanged"
            )

    @classmethod
    def from_state(cls, described: Any) -> Layout:
        """The layout a state's ``"elastic"`` field describes (None: the plain sharding)."""
        if described is None:
            return cls()
        ok = isinstance(described, dict) and set(described) == {"frontier", "extra", "partial"}
        if ok:
            try:
                return cls(described["frontier"], described["extra"], described["partial"])
            except (TypeError, ValueError):
                pass
        raise StateMismatchError(
            f"state field elastic={str(described)[:200]} is invalid: expected a dict with "
            f"frontier, extra and partial, as get_state() makes it; pass the state unchanged"
        )

    def describe(self) -> dict[str, Any] | None:
        """The JSON-able form a state keeps (None for the plain sharding)."""
        if not self.extra and not self.frontier and not self.partial:
            return None
        partial = [[g, sub, used] for (g, sub), used in sorted(self.partial.items())]
        return {"frontier": self.frontier, "extra": self.extra, "partial": partial}

    def at(self, indices: np.ndarray) -> np.ndarray:
        """``U[i]`` for each index ``i`` of the unread positions in order."""
        n = len(self.leftovers)
        inside = indices < n
        out = self.frontier + indices - n
        if inside.any():
            out[inside] = self.leftovers[indices[inside]]
        return out

    def size(self, end: int | None) -> int | None:
        """How many unread positions a stream of ``end`` global positions has."""
        if end is None:
            return None
        return len(self.leftovers) + max(0, end - self.frontier)

    def index_of(self, g: int) -> int:
        """The index in ``U`` of global position ``g`` (which is unread)."""
        n = len(self.leftovers)
        if g >= self.frontier:
            return n + g - self.frontier
        i = int(np.searchsorted(self.leftovers, g))
        assert i < n and self.leftovers[i] == g, g
        return i


Used = Sequence[tuple[int, int, Any]]  # (local position, sub, None or offsets) of one host


def next_layout(layout: Layout, count: int, read: Sequence[tuple[int, Used]], end: int | None) -> Layout:
    """The unread part after ``count`` hosts of ``layout`` read ``read[h] = (p_h, used_h)``:
    their first ``p_h`` positions, and of later ones the outputs ``used_h`` names
    (``(q, sub, None)``: all of output ``sub`` of local position ``q``; or up to offsets).

    ``end`` is the global stream's length (None: endless); see the module docstring.
    """
    n = len(layout.leftovers)
    first = [h + count * p for h, (p, _) in enumerate(read)]  # each host's first unread index
    total = layout.size(end)
    if total is not None:
        first = [min(f, total) for f in first]
    top = max(first)
    extra: list[list[int]] = []
    for f in first:
        lag = np.arange(f, top, count, dtype=np.int64)
        if total is not None:
            lag = lag[lag < total]
        if len(lag):
            extra += _runs(layout.at(lag))
    if top < n:  # the old leftovers from U[top] on stay leftovers
        cut = int(layout.leftovers[top])
        for s, d, c in layout.extra:
            skip = min(c, max(0, -(-(cut - s) // d)))
            extra.append([s + d * skip, d, c - skip])
        frontier = layout.frontier
    else:
        frontier = layout.frontier + top - n
    partial: dict[tuple[int, int], Any] = {}
    for (g, sub), used in layout.partial.items():  # of positions still unread
        i = layout.index_of(g)
        if i // count >= read[i % count][0]:
            partial[g, sub] = used
    for h, (_, outputs) in enumerate(read):
        for q, sub, used in outputs:
            g = int(layout.at(np.array([h + count * int(q)]))[0])
            partial[g, int(sub)] = _merge(partial[g, int(sub)], used) if (g, int(sub)) in partial else used
    # Leftovers that reach up to the frontier without a gap join it: after a plain batch
    # (every host at the same position) nothing is left over, and host j of H' reads
    # frontier + j + H'*p, the same global batches as before the change.
    ends = np.sort(np.concatenate([s + d * np.arange(c, dtype=np.int64) for s, d, c in extra]) if extra else [])
    k = 0
    while k < len(ends) and ends[len(ends) - 1 - k] == frontier - 1 - k:
        k += 1
    if k:
        frontier -= k
        extra = [[s, d, min(c, max(0, -(-(frontier - s) // d)))] for s, d, c in extra]
    return Layout(frontier, extra, [(g, sub, used) for (g, sub), used in partial.items()])


class ElasticSampler:
    """One host's share of a :class:`Layout`: host ``j`` of ``H`` reads ``U[j + H*p]``.

    A :class:`~dataloader.samplers.Sampler`: filters, flat maps, random maps (keyed by
    the global position) and workers run on it as on the sampler it wraps.

    Args:
        base: the sampler of the global stream's order (any shard options: it is read
            unsharded), e.g. an ``IndexSampler`` or a mixture's.
        layout: what is still to be read.
        shard_options: which share this host reads.
    """

    def __init__(self, base: Any, layout: Layout, shard_options: ShardOptions) -> None:
        if shard_options.drop_remainder:
            raise ValueError(
                f"elastic restore needs shard_options with drop_remainder=False, got "
                f"{shard_options}: the positions a host count drops at the end differ by host count"
            )
        self.base = base.with_shard_options(ShardOptions(0, 1))
        self.layout = layout
        self.shard_options = shard_options
        self.num_records = self.base.num_records
        self.shuffle = self.base.shuffle
        self.seed = self.base.seed
        self.num_epochs = self.base.num_epochs
        self.index_map_signature = self.base.index_map_signature
        j, count = shard_options.shard_index, shard_options.shard_count
        total = layout.size(self.base.num_positions)
        self._num_positions = None if total is None else max(0, -(-(total - j) // count))
        # What was used of outputs of this host's positions: (local position, sub) ->
        # None (drop the output) or offsets (hand out its rest).
        self.local_skips: dict[tuple[int, int], Any] = {}
        for (g, sub), used in layout.partial.items():
            i = layout.index_of(g)
            if i % count == j:
                self.local_skips[i // count, sub] = used

    @property
    def num_positions(self) -> int | None:
        return self._num_positions

    def global_positions(self, positions: Any) -> np.ndarray:
        """The global position of each local position (int64, same shape)."""
        array = np.asarray(positions, dtype=np.int64)
        flat = array.reshape(-1)
        if len(flat) and (flat.min() < 0 or (self._num_positions is not None and flat.max() >= self._num_positions)):
            raise IndexError(
                f"positions {flat.min()}..{flat.max()} outside this host's stream of "
                f"{self._num_positions} positions"
            )
        count, j = self.shard_options.shard_count, self.shard_options.shard_index
        return self.layout.at(j + count * flat).reshape(array.shape)

    def record_keys(self, positions: Any) -> np.ndarray:
        """The record index at each local position."""
        return np.asarray(self.base.record_keys(self.global_positions(positions)), dtype=np.int64)

    def with_shard_options(self, shard_options: ShardOptions) -> ElasticSampler:
        """The same layout, read as the share ``shard_options``."""
        return ElasticSampler(self.base, self.layout, shard_options)

    def __repr__(self) -> str:
        return f"ElasticSampler({self.base!r}, layout={self.layout.describe()}, shard_options={self.shard_options!r})"


def head_state(state: Any) -> tuple[dict[str, Any], list[tuple[int, int, Any]]]:
    """The engine's state inside a loader's state (under a packer's stages, if any), and
    the outputs the stages used beyond it: ``(local position, sub, None or offsets)``,
    from a packer state's ``"used"`` (the records of its rows already handed out).

    Raises:
        StateMismatchError: a stage holds records that its state does not name as
            positions (an element cut into pieces across rounds, a stage over a stage).
    """
    if isinstance(state, (str, bytes, bytearray)):
        state = json.loads(state)
    if not isinstance(state, dict):
        raise StateMismatchError(f"expected a state dict from get_state(), got {str(state)[:200]}")
    node: Any = state.get("stages", state)
    used: list[tuple[int, int, Any]] = []
    while isinstance(node, dict) and "made_for" not in node:
        held = node.get("piece", 0) or node.get("next_row", 0) or node.get("offsets") or node.get("skip", 0) \
            or node.get("pos_in_window", 0)
        stage = "packer" in node or "window_index" in node  # a packer's or a window shuffle's state
        if (stage and held and "used" not in node) or (not stage and node.get("skip", 0)):
            raise StateMismatchError(
                f"this state holds records in a stage ({node.get('packer', 'a window shuffle' if 'window_index' in node else 'an element-wise stage')}, "
                f"{ {k: node[k] for k in ('piece', 'next_row', 'offsets', 'skip', 'pos_in_window') if k in node} }) that "
                f"it does not name as positions, so an elastic restore would lose or repeat them: "
                f"rows of a round handed out so that a middle piece of an element cut into pieces "
                f"came out before both its neighbours, an element-wise stage inside one "
                f"element's outputs, or a packer or window shuffle over a stage that cannot say which "
                f"engine elements its outputs hold (a flat map after an iterator-level stage, a "
                f"packer cutting another packer's rows); save at another step or restore on the "
                f"same host count"
            )
        used += [(int(q), int(sub), u) for q, sub, u in node.get("used", ())]
        node = node.get("parent")
    if not isinstance(node, dict):
        raise StateMismatchError(
            f"found no loader state (a dict with made_for) inside {str(state)[:200]}; pass "
            f"the states the loader's iterators returned"
        )
    return node, used


def elastic_sampler(sampler: Any, states: Sequence[Any], now: dict[str, Any]) -> ElasticSampler:
    """This host's share of what the old hosts (``states``: one per old host, any order)
    left unread; ``sampler`` is this loader's, ``now`` its ``made_for``.

    Raises:
        StateMismatchError: the states are not one per old host of one run, or were
            made for another data set, order or pipeline.
    """
    found = [head_state(s) for s in states]
    heads = [h for h, _ in found]
    if not heads:
        raise StateMismatchError("elastic restore needs every old host's state, got none")
    for h in heads:
        _check_fits(h, now)
    count = heads[0]["made_for"]["shard_count"]
    shards = sorted(h["made_for"]["shard_index"] for h in heads)
    if shards != list(range(count)) or any(h["made_for"]["shard_count"] != count for h in heads):
        raise StateMismatchError(
            f"elastic restore needs one state from each of the old hosts, got shards "
            f"{shards} of shard counts {sorted({h['made_for']['shard_count'] for h in heads})}; "
            f"pass every old host's get_state() (e.g. every process's file of the checkpoint)"
        )
    layouts = {json.dumps(h.get("elastic"), sort_keys=True) for h in heads}
    if len(layouts) != 1:
        raise StateMismatchError(
            f"the old hosts' states describe {len(layouts)} different layouts; pass the states "
            f"of one step of one run"
        )
    for h in heads:
        if h.get("skip"):
            raise StateMismatchError(
                f"state of shard {h['made_for']['shard_index']} has skip={h['skip']}: it is inside "
                f"the outputs of an operation after the Batch, which an elastic restore cannot "
                f"split between hosts; save between batches"
            )
    found.sort(key=lambda f: f[0]["made_for"]["shard_index"])
    base = getattr(sampler, "base", sampler)
    layout = Layout.from_state(heads[0].get("elastic"))
    end = base.with_shard_options(ShardOptions(0, 1)).num_positions
    read: list[tuple[int, Used]] = []
    for head, used in found:
        p = int(head["position"])
        begun = [(p, s, None) for s in range(int(head["sub_index"]))]  # a flat map's first outputs
        read.append((p, [*begun, *used]))
    new = next_layout(layout, count, read, end)
    return ElasticSampler(base, new, sampler.shard_options)


def _check_fits(head: dict[str, Any], now: dict[str, Any]) -> None:
    saved = head.get("made_for", {})
    keys = ("num_records", "shuffle", "seed", "num_epochs", "layout", "operations", "index_map")
    differ = [f"{k}={saved.get(k)!r} but this loader has {k}={now.get(k)!r}" for k in keys if saved.get(k) != now.get(k)]
    if differ:
        raise StateMismatchError(
            "this state does not fit the loader: it was saved for " + "; ".join(differ)
            + " (elastic restore changes the host count and batch size only)"
        )


def _rest(element: Any, offsets: dict[str, int]) -> Any:
    """The part of ``element`` a packer has not used: each feature from its offset on
    (a nested feature is named by its path, ``"a/b"``; a scalar is a length-1 sequence,
    as packers read it)."""
    rest = dict(element)
    for key, offset in offsets.items():
        start, stop = _span(offset)
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


class _SkippingExecutor:
    """An executor whose units lack what a layout says was used of their outputs."""

    def __init__(self, inner: Any, skips: dict[tuple[int, int], Any]) -> None:
        self._inner, self._skips = inner, skips
        self._positions = {q for q, _ in skips}

    def __iter__(self) -> _SkippingExecutor:
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

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def with_sampler(engine: Any, sampler: Any) -> Any:
    """``engine`` (a ``LoaderEngine``) reading ``sampler``: the same operations and executor
    kind, on a plan whose sampler is ``sampler`` (an :class:`ElasticSampler`, or any
    sampler with ``local_skips``)."""
    plan = dataclasses.replace(engine.plan, sampler=sampler)
    made = engine.make_executor
    if not isinstance(made, functools.partial) or not made.args:
        raise TypeError(f"cannot rebuild the executor factory {made!r} for an elastic restore")
    args = list(made.args)
    args[0] = plan
    if len(args) > 1 and isinstance(args[1], (bytes, bytearray)) and args[1]:
        from dataloader.engine.pool.messages import pickle_plan

        args[1] = pickle_plan(plan)
    factory = functools.partial(made.func, *args, **made.keywords)
    skips = sampler.local_skips

    def make_executor(position: int) -> Any:
        executor = factory(position)
        return _SkippingExecutor(executor, skips) if skips else executor

    # The fingerprint check stays on: a step's fingerprint names the outputs its layout
    # dropped ("dropped"), and the check drops them from what it recomputes.
    return dataclasses.replace(engine, plan=plan, make_executor=make_executor)


def engine_for(home: Any, current: Any, state: Any) -> tuple[Any, Any]:
    """The engine a state calls for, and the state to resolve on it (None: its start).

    ``home`` is the loader's own engine (the plain sharding), ``current`` the one the
    iterator runs now. ``state`` is a state (the plain sharding, or a layout an elastic
    restore made: that layout), or a list of every old host's states (a new layout).
    A list whose hosts all stopped at one batch boundary of a plain ``Batch`` keeps the
    loader's single-state restore (the same global batches; ``drop_remainder`` sharding
    too).
    """
    from dataloader.engine.state import made_for, resolve_state

    if isinstance(state, (list, tuple)):
        states = list(state)
        if not all(isinstance(s, (dict, str, bytes, bytearray)) for s in states):
            raise StateMismatchError(
                f"expected a state dict from get_state(), got list {str(states)[:200]}; for an "
                f"elastic restore, pass a list of every old host's state dicts"
            )
        heads = [head_state(s) for s in states]
        positions = {(h["position"], h["sub_index"], h["skip"], json.dumps(h.get("elastic"))) for h, _ in heads}
        if len(positions) == 1 and not any(used for _, used in heads) and heads[0][0].get("elastic") is None \
                and home.plan.layout == "batch" and heads[0][0] is states[0]:
            try:
                resolve_state(home.plan, states[0])
                return home, states[0]
            except StateMismatchError:
                pass  # another global batch size, or not at a global batch boundary
        sampler = elastic_sampler(home.plan.sampler, states, made_for(home.plan))
        return with_sampler(home, sampler), None
    if isinstance(state, (str, bytes, bytearray)):
        try:
            state = json.loads(state)
        except ValueError:
            return home, state  # resolve_state says what is wrong with it
    layout = state.get("elastic") if isinstance(state, dict) else None
    if layout is None:
        return home, state
    now = getattr(current.plan.sampler, "layout", None)
    if now is not None and now.describe() == layout:
        return current, state
    sampler = ElasticSampler(home.plan.sampler, Layout.from_state(layout), home.plan.sampler.shard_options)
    return with_sampler(home, sampler), state
