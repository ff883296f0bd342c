"""States written by Google's Grain, read as granary states where that is exact.

A checkpoint made with Grain's ``DataLoader`` holds, per process, JSON like::

    {"version": 2, "last_seen_indices": {"0": 11}, "last_worker_index": -1,
     "worker_count": 0, "sampler": "IndexSampler(num_records=60, shard_options=
     ShardOptions(shard_index=0, shard_count=1, drop_remainder=False), shuffle=True,
     num_epochs=2, seed=1)", "data_source": "RangeDataSource(start=0, stop=60, step=1)"}

``last_seen_indices`` are global sampler positions (``g = shard_index + p * shard_count``
for local position ``p``, the same arithmetic as granary's sharding), so the next local
position is ``(last_seen - shard_index) / shard_count + 1``. :func:`from_grain` turns
such a state into granary's, using the state of the iterator being restored for what
it was made for, when the continuation is exact:

* ``worker_count`` 0 or 1. With more workers Grain's DataLoader batches each worker's
  own stride of the stream and interleaves the batches, so its order depends on the
  worker count and granary (whose order never does) cannot continue it.
* neither shuffle nor sharding, or a position at an epoch boundary: granary's
  permutation is its own (a Feistel network), not Grain's, and its shards interleave
  where Grain's are contiguous blocks, so mid-epoch the rest of a shuffled or sharded
  epoch would repeat some records and skip others. At a boundary every later epoch is
  whole in both (in granary's order; unshuffled and unsharded, the very same records).
* the sampler's ``num_records``, ``shuffle``, ``seed``, ``num_epochs`` and sharding
  match the iterator's.

Anything else is refused with :class:`~dataloader.StateMismatchError` saying why.

Grain's **dataset iterators** save ``{"next_index": n}`` for ``MapDataset ...
.to_iter_dataset()`` followed by maps, filters, batches and (thread) prefetches (each
passes its parent's state on), and ``mp_prefetch`` nests it in an interleave's state
(``{"iterators_in_use_states": [{"next_index": n}], ...}``, one per worker). ``n``
counts indices of the ``MapDataset`` that ``to_iter_dataset`` reads, as granary's
position does (``n`` batches of ``B`` are ``n * B`` positions when that ``MapDataset``
itself is batched), so :func:`from_grain_dataset` continues it exactly when granary
reads those indices in Grain's order: unshuffled, or shuffled with
``permutation="grain"`` (no window shuffle), unsharded by ``shard_options``, with one
``mp_prefetch`` worker, and no stage holding state of its own (packers, rebatching).
"""

from __future__ import annotations

import re
from typing import Any

from dataloader.errors import StateMismatchError
from dataloader.samplers import IndexSampler

_PAIR = re.compile(r"(\w+)=([\w.+-]+)")
_SAMPLER_KEYS = ("num_records", "shuffle", "seed", "num_epochs", "shard_index", "shard_count")
_REQUIRED = ("num_records", "shard_index", "shard_count")


def is_grain_state(state: Any) -> bool:
    """Whether ``state`` is a state of Grain's (not granary's) iterators."""
    return isinstance(state, dict) and "made_for" not in state and (
        "last_seen_indices" in state or "next_index" in state or "workers_state" in state
        or "iterators_in_use_states" in state
    )


def _value(text: str) -> Any:
    if text in ("True", "False"):
        return text == "True"
    if text == "None":
        return None
    try:
        return int(text)
    except ValueError:
        return text


def parse_sampler(text: str) -> dict[str, Any]:
    """The fields of a Grain sampler's ``repr`` that granary's ``made_for`` also has.

    Raises:
        StateMismatchError: the text names none of num_records, shard_index, shard_count.

    Example:
        >>> parse_sampler("IndexSampler(num_records=6, shard_options=ShardOptions("
        ...     "shard_index=0, shard_count=1, drop_remainder=False), shuffle=False, "
        ...     "num_epochs=1, seed=None)")["num_records"]
        6
    """
    fields = {key: _value(value) for key, value in _PAIR.findall(str(text))}
    found = {key: fields[key] for key in _SAMPLER_KEYS if key in fields}
    missing = [key for key in _REQUIRED if key not in found]
    if missing:
        raise StateMismatchError(
            f"the Grain state's sampler {text!r} does not say its {', '.join(missing)}; "
            f"granary can only restore states of Grain's IndexSampler"
        )
    return found


def from_grain(state: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
    """Grain's DataLoader ``state`` as granary's, for an iterator whose state is ``current``.

    Args:
        state: the dict Grain's ``DataLoaderIterator.get_state()`` gave (JSON-decoded).
        current: the restoring iterator's own ``get_state()`` (a granary state), which
            says what the stream is made for.

    Returns:
        ``current`` moved to the position the Grain state continues from.

    Raises:
        StateMismatchError: the state is not one granary can continue exactly (see the
            module docstring); the message says why and what to do.
    """
    if "last_seen_indices" not in state:
        raise StateMismatchError(
            f"this is a state of Grain's dataset iterators (keys {sorted(state)}); it "
            f"restores through the set_state of the dataset iterator it was saved from "
            f"(iter(ds).set_state(state)), which knows the order of its stream"
        )
    if not isinstance(current, dict) or "made_for" not in current or "position" not in current:
        raise StateMismatchError(
            "a state of Grain's DataLoader restores only into a granary DataLoader (or a "
            f"dataset iterator, or a device feed over one), whose state has a position; "
            f"this iterator's state is {str(current)[:120]}"
        )
    workers = state.get("worker_count")
    if not isinstance(workers, int) or workers > 1:
        raise StateMismatchError(
            f"the Grain state was saved with worker_count={workers!r}: Grain's DataLoader "
            f"interleaves per-worker batches, so its order depends on the worker count and "
            f"granary cannot continue it exactly; only states saved with worker_count 0 or "
            f"1 convert"
        )
    made_for = current["made_for"]
    sampler = parse_sampler(state.get("sampler", ""))
    differ = [
        f"{key}={sampler[key]!r} but this iterator has {key}={made_for.get(key)!r}"
        for key in _SAMPLER_KEYS
        if key in sampler and sampler[key] != made_for.get(key)
    ]
    if differ:
        raise StateMismatchError("the Grain state does not fit this iterator: " + "; ".join(differ))
    seen = state["last_seen_indices"]
    if not isinstance(seen, dict) or len(seen) != 1:
        raise StateMismatchError(
            f"the Grain state's last_seen_indices={seen!r} should hold one worker's index"
        )
    (last,) = seen.values()
    index, count = made_for["shard_index"], made_for["shard_count"]
    if not isinstance(last, int) or (last - index) % count:
        raise StateMismatchError(
            f"the Grain state's last seen index {last!r} is not a position of shard "
            f"{index} of {count}"
        )
    position = (last - index) // count + 1
    if not _exact(position, made_for["num_records"], count, made_for["shuffle"]):
        why = "a shuffled" if made_for["shuffle"] else "a sharded"
        raise StateMismatchError(
            f"the Grain state is in the middle of {why} epoch (local position {position}); "
            f"granary's permutation and sharding are not Grain's (Grain's shards are "
            f"contiguous blocks, granary's interleaved), so the rest of the epoch would "
            f"repeat some records and skip others. Restore a Grain state saved at an epoch "
            f"boundary, or start the epoch over (restore nothing)"
        )
    return {**current, "position": position, "sub_index": 0, "skip": 0}


def _exact(position: int, num_records: int, shard_count: int, shuffle: bool) -> bool:
    """Whether granary continues Grain's stream exactly from local ``position``: the
    same records when neither shuffles nor shards the stream, else at an epoch
    boundary (each shard of ``num_records / shard_count`` records), where every epoch
    that follows is whole in both."""
    if position == 0 or (shard_count == 1 and not shuffle):
        return True
    per_shard, remainder = divmod(num_records, shard_count)
    return remainder == 0 and per_shard > 0 and position % per_shard == 0


# The keys of a granary state that a Grain dataset-iterator state can stand for: a
# position and what it was made for; anything more is a stage's own state.
_PLAIN_KEYS = {"version", "position", "sub_index", "skip", "made_for"}
_HOW = (
    "restore from a checkpoint granary saved, or start the stream over (restore nothing)"
)


def reads_grains_order(sampler: Any) -> bool:
    """Whether a DataLoader's ``sampler`` reads its records in Grain's dataset order: no
    shuffle, or ``permutation="grain"`` (a dataset's iterator is told by its dataset)."""
    return not sampler.shuffle or (isinstance(sampler, IndexSampler) and sampler.permutation == "grain")


def dataset_next_index(state: dict[str, Any]) -> int:
    """The ``next_index`` a Grain dataset-iterator ``state`` continues from.

    Raises:
        StateMismatchError: a state of several ``mp_prefetch`` workers, or of a stage
            that holds more than an index.
    """
    if "iterators_in_use_states" in state:  # mp_prefetch: an interleave of its workers
        inner = state["iterators_in_use_states"]
        if not isinstance(inner, list) or len(inner) != 1 or state.get("future_states"):
            count = len(inner) if isinstance(inner, list) else inner
            raise StateMismatchError(
                f"this Grain state was saved under mp_prefetch with {count} workers: each "
                f"Grain worker reads its own stride of the stream and their outputs are "
                f"interleaved, so the order depends on the worker count, and granary's "
                f"does not; it cannot continue it exactly. Only states of one worker "
                f"convert; {_HOW}"
            )
        return dataset_next_index(inner[0])
    if "workers_state" in state:  # older mp_prefetch: one state per worker
        workers, skips = state["workers_state"], state.get("iterations_to_skip") or {}
        if not isinstance(workers, dict) or len(workers) != 1 or any(skips.values()):
            raise StateMismatchError(
                f"this Grain state was saved by {len(workers)} mp_prefetch workers, whose "
                f"interleaved order granary cannot continue exactly; {_HOW}"
            )
        (inner,) = workers.values()
        return dataset_next_index(inner)
    index = state.get("next_index")
    if set(state) != {"next_index"} or isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise StateMismatchError(
            f"this Grain dataset-iterator state ({str(state)[:120]}) holds more than an "
            f"index (or an index that is not a non-negative integer): a Grain stage with "
            f"state of its own (a packer, a flat map, a window shuffle), which granary "
            f"cannot continue exactly; {_HOW}"
        )
    return index


def from_grain_dataset(
    state: dict[str, Any], current: dict[str, Any], *, grain_order: bool, positions_per_index: int = 1,
    end: int | None = None,
) -> dict[str, Any]:
    """A Grain dataset-iterator ``state`` as granary's, for an iterator whose state is ``current``.

    Args:
        state: what Grain's ``DatasetIterator.get_state()`` gave (JSON-decoded).
        current: the restoring iterator's own ``get_state()``.
        grain_order: whether the restoring stream reads its indices in Grain's order
            (:func:`reads_grains_order`).
        positions_per_index: granary positions per index of Grain's ``MapDataset``
            (its batch size when that ``MapDataset`` is batched).
        end: the stream's number of positions, if finite (a short last batch ends it
            before ``index * positions_per_index``).

    Raises:
        StateMismatchError: the continuation would not be exact; the message says why and
            what to do.
    """
    index = dataset_next_index(state)
    if not isinstance(current, dict) or "made_for" not in current or "position" not in current:
        raise StateMismatchError(
            f"this is a Grain dataset-iterator state ({str(state)[:80]}); it restores into "
            f"a granary iterator of MapDataset...to_iter_dataset(), whose state has a "
            f"position; this iterator's state is {str(current)[:120]}"
        )
    extra = sorted(set(current) - _PLAIN_KEYS)
    if extra:
        raise StateMismatchError(
            f"this is a Grain dataset-iterator state ({str(state)[:80]}), which holds one "
            f"index; this pipeline has stages with state of their own ({', '.join(extra)}) "
            f"that it does not carry, so it cannot continue exactly; {_HOW}"
        )
    made_for = current["made_for"]
    if made_for.get("shard_count", 1) != 1:
        raise StateMismatchError(
            f"this is a Grain dataset-iterator state ({str(state)[:80]}); this stream is "
            f"sharded by shard_options ({made_for['shard_index']} of "
            f"{made_for['shard_count']}, interleaved), which Grain's to_iter_dataset has "
            f"no counterpart of; shard with ds[h::H] as in Grain to continue it, or {_HOW}"
        )
    if not grain_order:
        raise StateMismatchError(
            f"this is a Grain dataset-iterator state ({str(state)[:80]}): its index counts "
            f"elements in Grain's shuffle order, and this pipeline shuffles in granary's "
            f"(or window-shuffles), so the rest of the epoch would repeat some records and "
            f"skip others. Build the shuffle with shuffle(..., permutation='grain'), or set "
            f"GRANARY_PERMUTATION=grain (install_grain_alias(permutation='grain')) before "
            f"the dataset is built, to read Grain's order and continue exactly; or {_HOW}"
        )
    position = index * positions_per_index
    if end is not None and positions_per_index > 1:
        position = min(position, end)
    return {**current, "position": position, "sub_index": 0, "skip": 0}
