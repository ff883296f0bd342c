"""``IterDataset.mix(..., weight_by="tokens", length=f)``: weights that hold for tokens.

Lengths are known only once an element is read, so this mixture is sequential, at the
iterator level: before each output it compares every component's tokens so far,
``T_c``, with its target share of all tokens so far, ``W_c(T)`` for ``T = sum T_c``
(``w_c * T`` for fixed weights; the integral of the schedule's weights over the first
``T`` tokens for a :class:`~dataloader.WeightSchedule`, whose ``at`` then counts tokens),
and draws from the component furthest behind, ``argmax_c W_c(T) - T_c`` among the
components of weight > 0 at ``T`` (the lowest index on a tie). The shortfall of every
component stays within about one element's length, so over a window of ``T`` tokens
the shares are within ``max_length / T`` of the weights: 0.2% over a million tokens
for elements of up to 2,048 tokens.

The choice depends only on the tokens counted so far, which depend only on the
components' streams: the mixture is deterministic, and its state is the components'
states plus ``T_c`` (one integer a component). A restore continues exactly.

**Many hosts.** Each host mixes its own shard of every component and counts its own
tokens; the job's count of a component is the sum over the hosts, and the job's
shortfall of a component is the sum of the hosts' (each within about one element), so
over ``T`` tokens of the job the shares are within ``H * max_length / T`` of the
weights on ``H`` hosts. A schedule's ``at`` counts the job's tokens, taken on each host
as ``H`` times its own (the host count read from the components' shard options), so a
switch comes at the same point of the job whatever ``H``.

**Elastic restore, exact.** Given every old host's states (a list), each component
restores from its own states on all the old hosts (so each record is used at most once,
as the components guarantee), and the job's counts ``S_c`` (the sums over the old hosts)
are split over the new hosts exactly: host ``h`` of ``H'`` starts from
``S_c // H' + (1 if h < S_c % H' else 0)``. The new hosts' counts sum to the old job's,
so the job's token accounting goes on without loss or gain, and each new host starts
with its share of the job's shortfall, which it makes up; the shares' error over the
job stays within ``H' * max_length / T`` (plus the old hosts' shortfall while it is made
up, at most ``H * max_length`` tokens). Where no component says which host this is (no
component is a stream on the engine, or a chain of stages over one) the counts go on
from the old hosts' mean instead: every record is still used at most once, but the job's
counts are then ``H'/H`` times the old ones.

As for ``IterDataset.mix``, the mixture ends when the component it draws from is
exhausted, and a dict of named datasets keeps the components' states by name.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dataloader.dataset.base import DatasetIterator, IterDataset
from dataloader.dataset.compile.mixing import check_weights
from dataloader.dataset.compile.schedule import WeightSchedule
from dataloader.dataset.compile.scheduled_mix import Piece, ScheduledMix
from dataloader.dataset.experimental.checks import per_component
from dataloader.engine.restore.protocol import RestoresEveryHost, chain_of
from dataloader.engine.stages.base import expect_state
from dataloader.errors import StateMismatchError

# From this many live components on, the shortfalls are compared in numpy (one pass of
# ~5 calls) rather than in a Python loop (~0.1 µs a component).
_VECTOR_FROM = 32


class TokenMixIterDataset(IterDataset):
    """The token-weighted mixture (see the module docstring).

    Args:
        parents: the components.
        weights: one weight per component, a ``WeightSchedule`` (``at`` in tokens), or
            ``None`` for equal shares.
        keys: the components' names when given as a dict, else ``None``.
        length: ``length(element)``, the element's number of tokens (an integer >= 0).
    """

    def __init__(self, parents: list[IterDataset], weights: Any, keys: list[str] | None,
                 length: Callable[[Any], int]) -> None:
        super().__init__(parents)
        what, n = "IterDataset.mix(weight_by='tokens')", len(parents)
        if isinstance(weights, WeightSchedule):
            self._schedule = weights.bind(n, keys, what=what)
        else:  # fixed weights: a schedule of one point, read as given (not Grain's proportions)
            fixed = check_weights(weights, n) or [1] * n
            self._schedule = WeightSchedule([(0, fixed)]).bind(n, what=what)
        self._keys, self._length = keys, length

    def __iter__(self) -> TokenMixIterator:
        return TokenMixIterator([iter(p) for p in self._parents], self._schedule, self._keys, self._length)

    def __repr__(self) -> str:
        names: list[Any] = list(self._keys or range(len(self._parents)))
        inner = ", ".join(f"{k!r}: {p!r}" for k, p in zip(names, self._parents))
        return f"IterDataset.mix({{{inner}}}, weights={self._schedule.describe()}, weight_by='tokens')"


class TokenMixIterator(DatasetIterator):
    """Draws each output from the component furthest behind its share of the tokens."""

    def __init__(self, parents: list[DatasetIterator], schedule: ScheduledMix,
                 keys: list[str] | None, length: Callable[[Any], int]) -> None:
        super().__init__(parents)
        self._schedule = schedule
        self._keys, self._length = keys, length
        self._starts = [p.get_state() for p in parents]  # for components a state lacks
        self._layout = host_layout(parents)
        self._hosts = self._layout[1] if self._layout is not None else 1
        self._tokens = [0] * len(parents)
        self._total = 0
        self._piece: Piece | None = None  # the schedule's piece holding the token count
        self._position = 0
        self._stopped = False

    def _choose(self) -> int:
        # The job's tokens, H times this host's; shortfalls are compared times H (the
        # same order as this host's own shortfalls, W_c(job) / H - T_c).
        hosts = self._hosts
        job = self._total * hosts
        piece = self._piece
        if piece is None or job < piece.start or (piece.stop is not None and job >= piece.stop):
            piece = self._piece = self._schedule.piece(job)
        into, tokens, base, weights = job - piece.start, self._tokens, piece.integral, piece.weights
        if len(piece.active) > _VECTOR_FROM:
            behind = np.asarray(base) + into * np.asarray(weights) - hosts * np.asarray(tokens, dtype=np.float64)
            live = np.asarray(piece.active)
            return int(live[np.argmax(behind[live])])
        best, most = piece.active[0], -math.inf
        for c in piece.active:  # the first on a tie
            behind = base[c] + into * weights[c] - hosts * tokens[c]
            if behind > most:
                best, most = c, behind
        return best

    def __next__(self) -> Any:
        if self._stopped:
            raise StopIteration
        c = self._choose()
        try:
            value = next(self._parents[c])
        except StopIteration:
            self._stopped = True
            raise
        n = self._length(value)
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
            raise ValueError(f"IterDataset.mix(weight_by='tokens'): length(element) must be an integer >= 0, "
                             f"got {n!r} for an element of component {self._name(c)}")
        self._tokens[c] += int(n)
        self._total += int(n)
        self._position += 1
        return value

    def _name(self, c: int) -> str:
        return repr(self._keys[c]) if self._keys is not None else str(c)

    def _by_name(self, values: list[Any]) -> Any:
        return values if self._keys is None else dict(zip(self._keys, values))

    def get_state(self) -> dict[str, Any]:
        parents = self._by_name([p.get_state() for p in self._parents])
        return {"position": self._position, "tokens": self._by_name(list(self._tokens)), "parents": parents}

    def set_state(self, state: Any) -> None:
        """Continues after ``state`` (every old host's states, a list: see
        :meth:`restore_every_host`)."""
        self._restore([state], every_host=False)

    def restore_every_host(self, states: Sequence[Any]) -> None:
        """Restores each component elastically from every old host's states, and splits
        the old hosts' summed token counts over the new hosts exactly (see the module
        docstring)."""
        self._restore(list(states), every_host=True)

    def _restore(self, states: list[Any], every_host: bool) -> None:
        if not states:
            raise StateMismatchError("IterDataset.mix(weight_by='tokens') was given an empty list of states")
        states = [expect_state(s, ("position", "tokens", "parents"), "IterDataset.mix(weight_by='tokens')")
                  for s in states]
        parents = [per_component(s["parents"], self._keys, self._starts, "states") for s in states]
        zeros = [0] * len(self._parents)
        tokens = [per_component(s["tokens"], self._keys, zeros, "token counts") for s in states]
        for c, parent in enumerate(self._parents):
            own = [p[c] for p in parents]
            parent.set_state(own if every_host else own[0])
        sums = [sum(int(t[c]) for t in tokens) for c in range(len(self._parents))]
        positions = sum(int(s["position"]) for s in states)
        if every_host and self._layout is not None:
            self._tokens = [split(total, *self._layout) for total in sums]
            self._position = split(positions, *self._layout)
        else:  # one state (then these are its own), or no layout known: the mean
            self._tokens = [total // len(states) for total in sums]
            self._position = positions // len(states)
        self._total, self._piece = sum(self._tokens), None
        self._stopped = False


def split(total: int, host: int, hosts: int) -> int:
    """Host ``host``'s share of ``total`` over ``hosts`` hosts: the shares are integers
    that sum to ``total`` exactly (the first ``total % hosts`` hosts one more)."""
    return total // hosts + (1 if host < total % hosts else 0)


def host_layout(parents: Sequence[Any]) -> tuple[int, int] | None:
    """``(shard_index, shard_count)`` of this host, from the first component that is a
    stream on the engine or a chain of stages over one (its engine's sampler's shard
    options), or None when no component says."""
    for parent in parents:
        if isinstance(parent, RestoresEveryHost):
            continue
        try:
            head = chain_of(parent)[-1]
        except StateMismatchError:
            continue
        options = head.sampler.shard_options
        return int(options.shard_index), int(options.shard_count)
    return None
