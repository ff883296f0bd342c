"""``IterDataset.mix``: one stream drawn from several, by weight.

Two ways, chosen by what is mixed:

* **On the engine** (a list of engine-backed streams: ``MapDataset...to_iter_dataset()``
  with element-wise calls, unbatched, not prefetched, sharded alike): the mixture
  compiles to one ``DataLoader`` whose state is one position (see
  :func:`dataloader.dataset.iter_dataset.mix_iter_datasets`). It mixes positions: a
  filter inside a component thins that component's share.
* **At the iterator level** (anything else: a packed stream, a user's ``IterDataset``,
  batched or prefetched streams, and every dict of named datasets): output ``i`` is the
  next element of the component that :class:`~dataloader.dataset.MixSchedule` puts at
  position ``i`` (Grain's order), so the proportions hold over the outputs,
  deterministically, independent of timing and worker counts. The state is the position and each
  component's state; a restore sets each component's state, nothing is replayed. Given
  every old host's states (a list), each component restores elastically from its own
  states on all of them and the position goes on from their mean.

Weights may be a :class:`~dataloader.WeightSchedule` either way (its ``at`` counts the
global stream's positions on the engine, this host's outputs at the iterator level), and
``weight_by="tokens"`` mixes by tokens at the iterator level (:mod:`.token_mix`).

As in Grain, the mixture ends as soon as a component it draws from is exhausted, and
mixing a dict ``{name: dataset}`` (weights a dict with the same keys) keeps the
components' states by name: a state restores into a mixture with other weights or other
components (a component missing from the state starts from its beginning; a state of
a component no longer mixed is ignored).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dataloader.dataset.base import DatasetIterator, IterDataset
from dataloader.dataset.compile.mixing import MixSchedule
from dataloader.dataset.compile.schedule import WeightSchedule, bind_weights
from dataloader.dataset.compile.scheduled_mix import Piece, ScheduledMix
from dataloader.dataset.experimental.checks import as_iter_dataset, per_component
from dataloader.dataset.experimental.token_mix import TokenMixIterDataset
from dataloader.engine.stages.base import expect_state
from dataloader.errors import StateMismatchError


def mix(
    datasets: Sequence[Any] | Mapping[str, Any],
    weights: Any = None,
    *,
    weight_by: str = "elements",
    length: Callable[[Any], int] | None = None,
) -> IterDataset:
    """``IterDataset.mix(datasets, weights, weight_by=..., length=...)`` (see the module
    docstring; ``weight_by="tokens"``: :mod:`.token_mix`).

    Raises:
        ValueError: no datasets, weights that do not match the datasets (count or keys),
            weights that ``MixSchedule`` or the ``WeightSchedule`` refuses, or a
            ``weight_by`` other than ``"elements"`` and ``"tokens"``.
        TypeError: a component that is not a dataset, dict keys that are not strings,
            or ``weight_by="tokens"`` without a ``length`` function.
    """
    if weight_by not in ("elements", "tokens"):
        raise ValueError(f"IterDataset.mix weight_by must be 'elements' or 'tokens', got {weight_by!r}")
    if weight_by == "tokens" and not callable(length):
        raise TypeError(f"IterDataset.mix(weight_by='tokens') needs length=, a function of an element that "
                        f"returns its number of tokens (e.g. lambda e: len(e['tokens'])), got {length!r}")
    if weight_by == "elements" and length is not None:
        raise ValueError("IterDataset.mix: length= counts tokens for weight_by='tokens'; pass "
                         "weight_by='tokens' too, or leave length out")
    scheduled = isinstance(weights, WeightSchedule)
    if isinstance(datasets, Mapping):
        keys = list(datasets)
        for key in keys:
            if not isinstance(key, str):
                raise TypeError(f"IterDataset.mix: dict keys must be names (str), got {key!r}")
        keys.sort()  # Grain's order (its tree flattening sorts dict keys)
        if weights is not None and not scheduled:
            if not isinstance(weights, Mapping) or set(weights) != set(keys):
                got = sorted(weights) if isinstance(weights, Mapping) else weights
                raise ValueError(
                    f"IterDataset.mix of a dict needs weights as a dict with the same keys "
                    f"{keys}, got {got!r}"
                )
            weights = [weights[k] for k in keys]
        components = [as_iter_dataset(datasets[k], f"IterDataset.mix datasets[{k!r}]") for k in keys]
        if weight_by == "tokens":
            return TokenMixIterDataset(components, weights, keys, length)  # type: ignore[arg-type]
        return MixIterDataset(components, weights, keys)
    datasets = list(datasets)
    if not datasets:
        raise ValueError("IterDataset.mix needs at least one dataset")
    if isinstance(weights, Mapping):
        raise ValueError(
            f"IterDataset.mix got weights as a dict ({sorted(weights)}) for a list of datasets; "
            f"pass a list of weights, or the datasets as a dict with the same keys"
        )
    components = [as_iter_dataset(d, f"IterDataset.mix datasets[{i}]") for i, d in enumerate(datasets)]
    if weight_by == "tokens":
        return TokenMixIterDataset(components, weights, None, length)  # type: ignore[arg-type]
    if _on_engine(components):
        from dataloader.dataset.iter_dataset import mix_iter_datasets

        return mix_iter_datasets(components, weights)
    return MixIterDataset(components, weights, None)


def _on_engine(datasets: list[Any]) -> bool:
    """Whether the mixture can compile to one engine (see the module docstring)."""
    from dataloader.dataset.iter_dataset import LoaderIterDataset

    for d in datasets:
        if type(d) is not LoaderIterDataset or d.shape.batched or d.shape.computed_ahead:
            return False
    return len({d.shape.shard_options for d in datasets}) == 1


class MixIterDataset(IterDataset):
    """The iterator-level mixture (see the module docstring).

    Args:
        parents: the components.
        weights: one non-negative weight per component (normalised), or ``None``.
        keys: the components' names when they were given as a dict, else ``None``.
    """

    def __init__(self, parents: list[IterDataset], weights: Any, keys: list[str] | None) -> None:
        super().__init__(parents)
        self._schedule = bind_weights(weights, len(parents), keys, "IterDataset.mix")
        self._keys = keys

    def __iter__(self) -> MixDatasetIterator:
        return MixDatasetIterator([iter(p) for p in self._parents], self._schedule, self._keys)

    def __repr__(self) -> str:
        if self._keys is None:
            inner = "[" + ", ".join(repr(p) for p in self._parents) + "]"
        else:
            inner = "{" + ", ".join(f"{k!r}: {p!r}" for k, p in zip(self._keys, self._parents)) + "}"
        return f"IterDataset.mix({inner}, weights={self._schedule.describe()})"


class MixDatasetIterator(DatasetIterator):
    """Draws output ``i`` from the component the schedule puts at position ``i``."""

    def __init__(
        self, parents: list[DatasetIterator], schedule: MixSchedule | ScheduledMix, keys: list[str] | None
    ) -> None:
        super().__init__(parents)
        self._schedule = schedule
        # a short period is looked up in a list; a long one (or a weight schedule) is
        # located position by position
        short = isinstance(schedule, MixSchedule) and schedule.period <= 4096
        self._table = schedule.table.tolist() if isinstance(schedule, MixSchedule) and short else None
        self._piece: Piece | None = None  # of a weight schedule: the one being read
        self._keys = keys
        self._starts = [p.get_state() for p in parents]  # for components a state lacks
        self._position = 0
        self._stopped = False

    def __next__(self) -> Any:
        if self._stopped:  # as in Grain: no draw after a component ran out
            raise StopIteration
        if self._table is not None:
            component = self._table[self._position % len(self._table)]
        elif isinstance(self._schedule, ScheduledMix):
            piece = self._piece
            p = self._position
            if piece is None or p < piece.start or (piece.stop is not None and p >= piece.stop):
                piece = self._piece = self._schedule.piece(p)
            component = piece.component(p)
        else:
            component = self._schedule.locate_one(self._position)[0]
        try:
            value = next(self._parents[component])
        except StopIteration:
            self._stopped = True
            raise
        self._position += 1
        return value

    def get_state(self) -> dict[str, Any]:
        states = [p.get_state() for p in self._parents]
        parents: Any = states if self._keys is None else dict(zip(self._keys, states))
        return {"position": self._position, "parents": parents}

    def set_state(self, state: Any) -> None:
        """Continues after ``state`` (every old host's states, a list: see
        :meth:`restore_every_host`)."""
        self._restore([state], every_host=False)

    def restore_every_host(self, states: Sequence[Any]) -> None:
        """An elastic restore onto another host count: each component restores from its
        states on all the old hosts, so each record is used at most once (as the
        components guarantee), and the position goes on from the old hosts' mean."""
        self._restore(list(states), every_host=True)

    def _restore(self, states: list[Any], every_host: bool) -> None:
        if not states:
            raise StateMismatchError("IterDataset.mix was given an empty list of states")
        states = [expect_state(s, ("position", "parents"), "IterDataset.mix") for s in states]
        parents = [per_component(s["parents"], self._keys, self._starts, "states") for s in states]
        for c, parent in enumerate(self._parents):
            own = [p[c] for p in parents]
            parent.set_state(own if every_host else own[0])
        self._position = sum(int(s["position"]) for s in states) // len(states)
        self._piece = None
        self._stopped = False
