"""Finite data that ends on the same step on every host: padded, masked last batches.

With ``num_epochs`` set and several hosts, one host may run out of batches before
another (a filter keeps fewer of its records, a packer fills fewer rows, a shard is one
record shorter). A global ``jax.Array`` needs a batch from every host at every step, so
a host that stops early hangs the others, and dropping the longer hosts' extra batches
loses data. :class:`EndTogether` (``DataLoader(..., end="pad")``) makes every host run
the same number of steps: a host that has run out gives **padding batches** (every leaf
zero, ``mask`` all false), and every batch, real or not, gets a boolean ``mask`` field
(True for a real row), so the loss and the metrics ignore the padding. A short last
batch is padded to the full batch size the same way (Grain's ``batch_and_pad``), so
every step has one shape.

How the hosts agree on the number of steps:

* **computed** (no communication): a plain ``Batch`` with no filter or flat map
  anywhere, over an :class:`~dataloader.IndexSampler`. Every host knows the number of
  records, epochs, hosts and the batch size, hence every host's batch count; the run
  is as long as the longest host's (:func:`static_steps`).
* **agreed** (a tiny exchange through JAX's runtime): anything else with ``H > 1``.
  Every ``lookahead`` steps each host reads up to ``lookahead`` batches ahead and sends
  two integers, how many it holds and whether its stream has ended. While any host has
  not ended, each host has ``lookahead`` batches in hand, so all step ``lookahead``
  times without asking; once all have ended, all step as many times as the fullest
  host holds, then stop. So a run of ``n`` steps costs ``ceil(n / lookahead) + 1``
  exchanges, and the step count is the longest host's batch count, whatever
  ``lookahead`` is. The exchange is a function passed in (the front door gives one on
  JAX's key-value store: :mod:`dataloader.device.ends`); the engine never imports JAX.

With one host, or an infinite stream, nothing is exchanged: batches only gain the mask.
A ``DataLoader`` counts hosts by its sampler's shard count; hosts that split the data
some other way (a source of their own each) use
:func:`~dataloader.device.ends.end_together`, which asks JAX for the process count.

**State.** The state is the parent's state of the last real batch handed out, plus
``end_padded`` (padding batches handed out since) and ``end_spec`` (the batch's leaves'
dtypes and shapes, so a restore in the padded tail can make padding without reading a
batch). Batches read ahead are not in it: a restore continues with the very next step.

**Elastic restore** (docs/elastic-restore.md): it is an
:class:`~dataloader.engine.restore.protocol.ElasticStage`, so ``set_state`` also takes
every old host's state (a list, as an Orbax restore on another process count hands it).
The padding keys are its part of each (padding batches hold no records, so a host that
was in its padded tail simply has nothing left over), the loader's iterator reads this
host's share of what the old hosts left, and the new hosts agree on a new end from
there: with an exchange, as from any step; with a computed step count, it is computed
again for the new layout (:func:`steps_over`: this host's batches of its share, and
shard 0's: the longest).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from dataloader.engine.restore.protocol import ElasticDefaults, StatePart
from dataloader.engine.restore.samplers import layout_of
from dataloader.engine.stages.base import DatasetIterator
from dataloader.errors import StateMismatchError
from dataloader.samplers import ShardOptions
from dataloader.samplers.sharding import shard_length

# Keys this stage adds to its parent's state.
PADDED, SPEC = "end_padded", "end_spec"

Exchange = Callable[[np.ndarray], np.ndarray]


@dataclasses.dataclass(frozen=True)
class PadEnd:
    """``end=`` of a loader: every host runs the same number of steps, padding the tail.

    Args:
        lookahead: with the agreed step count (a filter, flat map or packer on several
            hosts), steps taken between two exchanges, and batches read ahead for them;
            1 exchanges at every step.
        mask_key: the boolean field added to every batch, True for a real row.
        example: a batch (a dict of arrays) that gives the padding its dtypes and
            shapes on a host that never had a batch of its own; None: the host's first
            batch does.
        exchange: ``exchange()`` makes the function that hosts agree through (see
            :class:`EndTogether`); None: JAX's key-value store
            (:class:`~dataloader.device.ends.KeyValueExchange`). For tests and other runtimes.

    Example:
        >>> PadEnd(lookahead=4)
        PadEnd(lookahead=4, mask_key='mask')
    """

    lookahead: int = 8
    mask_key: str = "mask"
    example: Mapping[str, Any] | None = dataclasses.field(default=None, repr=False, compare=False)
    exchange: Callable[[], Exchange] | None = dataclasses.field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.lookahead, bool) or not isinstance(self.lookahead, int) or self.lookahead < 1:
            raise ValueError(f"PadEnd.lookahead must be an integer >= 1, got {self.lookahead!r}")
        if not isinstance(self.mask_key, str) or not self.mask_key:
            raise ValueError(f"PadEnd.mask_key must be a non-empty string, got {self.mask_key!r}")
        if self.example is not None and not isinstance(self.example, Mapping):
            raise TypeError(
                f"PadEnd.example must be a dict of arrays (a batch), got {type(self.example).__name__}"
            )


def resolve_end(value: Any) -> PadEnd | None:
    """``end=`` as given to a loader: None (stop where the data stops), ``"pad"`` or a
    :class:`PadEnd`."""
    if value is None or isinstance(value, PadEnd):
        return value
    if value == "pad":
        return PadEnd()
    raise ValueError(
        f'end must be None, "pad" or a dl.PadEnd(...), got {value!r}; "pad" makes every host '
        f"run the same number of steps, padding and masking its last batches"
    )


def batch_count(positions: int, batch_size: int, drop_remainder: bool) -> int:
    """Batches of ``batch_size`` that ``positions`` elements make."""
    return positions // batch_size if drop_remainder else -(-positions // batch_size)


def static_steps(sampler: Any, batch_size: int, drop_remainder: bool) -> tuple[int, int] | None:
    """``(this host's batches, every host's steps)`` of a plain batch over ``sampler``,
    from what every host knows; None when the stream is infinite or the sampler does not
    say (an unknown sampler type)."""
    try:
        total = sampler.num_records * sampler.num_epochs
        shard = sampler.shard_options
        own = sampler.num_positions
    except (AttributeError, TypeError):
        return None
    if own is None:
        return None
    # Shard 0 is the longest: shards differ by at most one position, the low ones longer.
    longest = shard_length(total, 0, shard.shard_count, shard.drop_remainder)
    return batch_count(own, batch_size, drop_remainder), batch_count(longest, batch_size, drop_remainder)


def steps_over(sampler: Any, batch_size: int, drop_remainder: bool) -> tuple[int, int] | None:
    """:func:`static_steps`, also over an elastic restore's layout (``sampler`` reads a
    share of it): this host's batches of its share, and shard 0's, the longest."""
    if layout_of(sampler) is None:
        return static_steps(sampler, batch_size, drop_remainder)
    longest = sampler.with_shard_options(ShardOptions(0, sampler.shard_options.shard_count))
    own, first = sampler.num_positions, longest.num_positions
    if own is None or first is None:
        return None
    return batch_count(own, batch_size, drop_remainder), batch_count(first, batch_size, drop_remainder)


def spec_of(batch: Any, path: str = "batch") -> dict[str, Any]:
    """The dtypes and shapes of a batch's leaves, as JSON (``{"k": [dtype, shape]}``,
    nested dicts as dicts)."""
    if not isinstance(batch, Mapping):
        raise TypeError(
            f'end="pad" needs batches that are dicts (it adds a mask field), got {path} of type '
            f"{type(batch).__name__}; map the batch to a dict, e.g. {{'x': batch}}"
        )
    spec: dict[str, Any] = {}
    for key, leaf in batch.items():
        if isinstance(leaf, Mapping):
            spec[key] = spec_of(leaf, f"{path}[{key!r}]")
        else:
            array = np.asarray(leaf)
            spec[key] = [array.dtype.str, list(array.shape)]
    return spec


def zeros_of(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A batch of zeros of the dtypes and shapes ``spec`` gives."""
    return {
        key: zeros_of(value) if isinstance(value, Mapping) else np.zeros(value[1], np.dtype(value[0]))
        for key, value in spec.items()
    }


def _rows(batch: Mapping[str, Any]) -> int:
    for leaf in batch.values():
        return _rows(leaf) if isinstance(leaf, Mapping) else int(np.shape(leaf)[0])
    raise ValueError('end="pad" got a batch with no fields; a batch needs at least one array')


def _pad_rows(batch: Mapping[str, Any], size: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, leaf in batch.items():
        if isinstance(leaf, Mapping):
            out[key] = _pad_rows(leaf, size)
            continue
        array = np.asarray(leaf)
        missing = size - array.shape[0]
        out[key] = array if missing == 0 else np.concatenate(
            [array, np.zeros((missing, *array.shape[1:]), array.dtype)]
        )
    return out


def pad_batch(batch: Mapping[str, Any], batch_size: int, mask_key: str) -> dict[str, Any]:
    """``batch`` padded with zero rows to ``batch_size``, with ``mask_key`` True on its rows.

    Raises:
        TypeError: the batch is not a dict. ValueError: it already has ``mask_key``, or
            more rows than ``batch_size``.
    """
    if not isinstance(batch, Mapping):
        spec_of(batch)  # raises, naming the type
    if mask_key in batch:
        raise ValueError(
            f"the batch already has a field {mask_key!r}; pass PadEnd(mask_key=...) with another name"
        )
    rows = _rows(batch)
    if rows > batch_size:
        raise ValueError(f"a batch of {rows} rows is larger than the batch size {batch_size}")
    out = _pad_rows(batch, batch_size)
    mask = np.zeros(batch_size, bool)
    mask[:rows] = True
    out[mask_key] = mask
    return out


class EndTogether(DatasetIterator[dict[str, Any]], ElasticDefaults):
    """Pads a host's batch stream so that every host stops on the same step.

    See the module docstring for how the step count is known.

    Args:
        parent: this host's batches (dicts of arrays).
        batch_size: rows of a host's batch (short batches are padded to it).
        end: the :class:`PadEnd` settings.
        steps: ``(this host's batches, every host's steps)`` when computed
            (:func:`static_steps`); None: agreed through ``exchange``, or, without one,
            the stream's own end (one host).
        exchange: ``exchange(values)``: the same call on every host, with this host's
            int64 vector; returns every host's, as rows of a ``(hosts, len)`` array. An
            optional ``reset()`` is called on ``set_state`` (every host restores at once).
        recount: with ``steps``, ``recount()`` computes them again after an elastic
            restore (the loader's: :func:`steps_over` its iterator's sampler); None: they
            stay as they were.
    """

    stats_name = "end_together"
    stats_batches = True

    def __init__(self, parent: Any, *, batch_size: int, end: PadEnd,
                 steps: tuple[int, int] | None = None, exchange: Exchange | None = None,
                 recount: Callable[[], tuple[int, int] | None] | None = None) -> None:
        super().__init__(parent)
        self._batch_size = batch_size
        self._end = end
        self._steps = steps
        self._exchange = exchange
        self._recount = recount
        self._spec: dict[str, Any] | None = spec_of(end.example) if end.example is not None else None
        self._reads_ahead = steps is None and exchange is not None
        # It may be closed from another thread (the device feed's close) where its parent
        # may: the exchange's wait then ends too (an optional close() of the exchange).
        self.closes_from_any_thread = isinstance(parent, DatasetIterator) and parent.closes_from_any_thread
        self._reset(self._parent_state() if self._reads_ahead else None, 0)

    def _parent_state(self) -> dict[str, Any] | None:
        get = getattr(self._parent, "get_state", None)
        return dict(get()) if get is not None else None

    def _reset(self, state: dict[str, Any] | None, padded: int) -> None:
        self._state = state  # the parent's, after the last real batch handed out
        self._padded = padded
        self._ahead: collections.deque[tuple[Any, dict[str, Any] | None]] = collections.deque()
        self._ended = False  # the parent raised StopIteration
        self._granted = 0  # steps every host may take before the next exchange
        self._final = False  # every host has ended: no exchange any more
        self.exchanges = 0

    def _pull(self) -> bool:
        """Reads one batch ahead; False when the parent has ended."""
        if self._ended:
            return False
        try:
            batch = next(self._parent)
        except StopIteration:
            self._ended = True
            return False
        # Only batches read ahead need their state kept (get_state describes the last
        # one handed out); otherwise the parent's own state is that one's.
        self._ahead.append((batch, self._parent_state() if self._reads_ahead else None))
        return True

    def _agree(self) -> None:
        """One exchange: how many steps every host takes before the next one."""
        lookahead = self._end.lookahead
        while len(self._ahead) < lookahead and self._pull():
            pass
        assert self._exchange is not None
        mine = np.asarray([len(self._ahead), int(self._ended)], np.int64)
        table = np.asarray(self._exchange(mine)).reshape(-1, 2)
        self.exchanges += 1
        going = table[table[:, 1] == 0, 0]
        if going.size:
            # A host that has not ended has filled its look-ahead: lookahead steps for all.
            self._granted = int(going.min())
        else:
            self._granted, self._final = int(table[:, 0].max()), True

    def __next__(self) -> dict[str, Any]:
        if self._closed:
            raise StopIteration
        if self._steps is not None:
            own, total = self._steps
            if not self._pull():
                if own + self._padded >= total:
                    raise StopIteration
                return self._padding()
        elif self._exchange is None:
            if not self._pull():
                raise StopIteration
        else:
            if self._granted == 0:
                if self._final:
                    raise StopIteration
                self._agree()
                if self._granted == 0:
                    raise StopIteration
            self._granted -= 1
            if not self._ahead:
                return self._padding()
        batch, self._state = self._ahead.popleft()
        if self._spec is None:
            self._spec = spec_of(batch)
        return pad_batch(batch, self._batch_size, self._end.mask_key)

    def _padding(self) -> dict[str, Any]:
        if self._spec is None:
            raise ValueError(
                'end="pad": this host has no batch of its own to shape its padding on; pass '
                "end=dl.PadEnd(example=<a batch>) with the dtypes and shapes of a full batch"
            )
        self._padded += 1
        batch = zeros_of(self._spec)
        rows = _rows(batch)
        out = _pad_rows(batch, self._batch_size) if rows < self._batch_size else batch
        out[self._end.mask_key] = np.zeros(self._batch_size, bool)
        return out

    def get_state(self) -> dict[str, Any]:
        """The parent's state of the last real batch handed out, with ``end_padded`` and
        ``end_spec``."""
        state = dict(self._state or {}) if self._reads_ahead else self._parent_state() or {}
        state[PADDED] = self._padded
        if self._spec is not None:
            state[SPEC] = self._spec
        return state

    def close(self) -> None:
        """Closes the parent and ends a wait for the other hosts; idempotent."""
        close = getattr(self._exchange, "close", None)
        if close is not None:
            close()
        super().close()

    def set_state(self, state: Any) -> None:
        """Continues with the step after ``state`` (every host restores at the same step)."""
        parent, padded, spec = self._own(state)
        self._parent.set_state(parent)
        self._restarted(spec, padded)

    def _own(self, state: Any) -> tuple[dict[str, Any], int, Any]:
        """The parent's state in ``state`` (without ``end_padded`` and ``end_spec``),
        the padding steps handed out since, and the spec."""
        if not isinstance(state, Mapping):
            raise StateMismatchError(f'expected a state dict of end="pad" from get_state(), got {str(state)[:200]}')
        parent = dict(state)
        padded = parent.pop(PADDED, 0)
        if isinstance(padded, bool) or not isinstance(padded, int) or padded < 0:
            raise ValueError(f"state[{PADDED!r}] must be an integer >= 0, got {padded!r}")
        return parent, padded, parent.pop(SPEC, None)

    def _restarted(self, spec: Any, padded: int) -> None:
        """After the parent moved: the computed step count again (the parent may read
        another elastic layout), the spec, the exchange, padding steps since the state."""
        if self._steps is not None and self._recount is not None:
            self._steps = self._recount() or self._steps
        if spec is not None:
            self._spec = spec
        reset = getattr(self._exchange, "reset", None)
        if reset is not None:
            reset()
        self._reset(self._parent_state() if self._reads_ahead else None, padded)

    # The elastic-restore protocol (dataloader.engine.restore.protocol.ElasticStage).

    def split_state(self, state: Any) -> StatePart:
        """A padding batch holds no records: what a host in its padded tail left is what
        its loader's state says. Keeps the spec."""
        parent, _, spec = self._own(state)
        return StatePart(parent, keep=spec)

    def restart_elastic(self, resume: Callable[[], None], kept: Sequence[Any]) -> None:
        """The loader's iterator reads this host's share; the new hosts agree on a new end
        (the computed step count is computed again for the new layout)."""
        resume()
        self._restarted(next((spec for spec in kept if spec is not None), None), 0)
