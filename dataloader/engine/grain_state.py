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

Anything else is refused with :class:`~dataloader.StateMismatchError` saying why, as
are the states of Grain's dataset iterators (``{"next_index": ...}`` and the nested
states of its prefetchers), whose indices count elements of a chain granary cannot
map onto its positions.
"""

from __future__ import annotations

import re
from typing import Any

from dataloader.errors import StateMismatchError

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
            f"this is a state of Grain's dataset iterators (keys {sorted(state)}), whose "
            f"indices count elements of a Grain chain that granary cannot map onto its "
            f"positions; restore from a checkpoint granary saved, or place the iterator "
            f"with dl.experimental.set_next_index if you know the next element's index"
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
