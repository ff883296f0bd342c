"""The iterator's state: where the stream continues, and what the state was made for.

A state is a small JSON-able dict (no data, no per-worker fields)::

    {"version": 1, "position": 1280, "sub_index": 0, "skip": 0,
     "made_for": {"num_records": ..., "seed": ..., "shard_count": ..., ...}}

``position`` is the local position (in this shard's stream) of the first record whose
outputs the user has not fully received; ``sub_index`` how many outputs of that
position were already handed out (after a flat map); ``skip`` how many outputs of the
next batch's post-batch operations were handed out. Restoring computes from
``position`` on: O(1), no replay.

Elastic restore: with a plain ``Batch`` (no filter or flat map before it), a state saved
on ``H`` shards at per-shard batch ``B`` restores on ``H'`` shards at ``B' = B*H/H'``:
global batch ``k`` is global positions ``[k*B*H, (k+1)*B*H)`` for every ``H``, so
position ``p`` becomes ``p*H/H'``.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from dataloader.engine.plan import BATCH, Plan
from dataloader.errors import StateMismatchError

STATE_VERSION = 1


class Cursor(NamedTuple):
    """Where a stream continues: the restart point after the last output handed out.

    Attributes:
        position: the local position of the first record whose outputs the user has
            not fully received.
        sub_index: how many outputs of that position were handed out already (after a
            flat map).
        skip: how many outputs of the next batch's post-batch operations were handed
            out already (after a flat map or filter that follows the batch).
    """

    position: int
    sub_index: int = 0
    skip: int = 0

# Fields that must match exactly; sharding and batch size are checked separately
# because elastic restore may change them together.
_EXACT = ("num_records", "shuffle", "seed", "layout", "operations")
_HINTS = {
    "num_records": "restore into a loader over the same data, or start from scratch",
    "shuffle": "build the sampler with the same shuffle setting",
    "seed": "build the sampler with the same seed",
    "layout": "keep the pipeline's operations as they were",
    "operations": "keep the pipeline's operations as they were",
    "index_map": "build the dataset with the same shuffle, repeat, slice, mix and concatenate steps",
}


def made_for(plan: Plan) -> dict[str, Any]:
    """What a state records about the loader it was made for."""
    sampler = plan.sampler
    ops = [s.op.name for s in plan.pre]
    if plan.batch is not None:
        ops.append(f"Batch(drop_remainder={plan.batch.drop_remainder})")
    ops += [s.op.name for s in plan.post]
    out = {
        "num_records": sampler.num_records,
        "shuffle": sampler.shuffle,
        "seed": sampler.seed,
        "num_epochs": sampler.num_epochs,
        "shard_index": sampler.shard_options.shard_index,
        "shard_count": sampler.shard_options.shard_count,
        "batch_size": plan.batch.batch_size if plan.batch is not None else None,
        "layout": plan.layout,
        "operations": ops,
    }
    # Samplers compiled from a dataset chain (mix, slice, ...) describe their index map;
    # an IndexSampler has none, so the loader's states keep their format.
    signature = sampler.index_map_signature
    if signature is not None:
        out["index_map"] = signature
    return out


def make_state(plan: Plan, cursor: Cursor) -> dict[str, Any]:
    """The JSON-able state of ``cursor`` in a stream of ``plan``."""
    return {
        "version": STATE_VERSION,
        "position": int(cursor.position),
        "sub_index": int(cursor.sub_index),
        "skip": int(cursor.skip),
        "made_for": made_for(plan),
    }


def _as_dict(state: Any) -> dict[str, Any]:
    if isinstance(state, (bytes, str)):  # Grain's iterators hand out JSON bytes
        state = json.loads(state)
    if not isinstance(state, dict) or "position" not in state or "made_for" not in state:
        raise StateMismatchError(
            f"expected a state dict from get_state(), got {type(state).__name__}: {str(state)[:200]}"
        )
    if state.get("version") != STATE_VERSION:
        raise StateMismatchError(
            f"state version {state.get('version')!r} is not supported (expected {STATE_VERSION})"
        )
    return state


def resolve_state(plan: Plan, state: Any) -> Cursor:
    """Checks that ``state`` fits ``plan`` and returns where its stream continues.

    Raises:
        StateMismatchError: naming every field that differs and what to do.
    """
    state = _as_dict(state)
    saved, now = state["made_for"], made_for(plan)
    problems = [
        f"{key}={saved.get(key)!r} but this loader has {key}={now.get(key)!r} ({_HINTS[key]})"
        for key in (*_EXACT, "index_map")
        if saved.get(key) != now.get(key)
    ]
    position, sub, skip = int(state["position"]), int(state["sub_index"]), int(state["skip"])
    same_sharding = (saved["shard_count"], saved["batch_size"]) == (now["shard_count"], now["batch_size"])
    if not problems and same_sharding and saved["shard_index"] != now["shard_index"]:
        problems.append(
            f"shard_index={saved['shard_index']} but this loader is shard "
            f"{now['shard_index']} (restore each shard from its own state)"
        )
    elif not problems and not same_sharding:
        position, problem = _elastic(saved, now, position, sub, skip)
        if problem:
            problems.append(problem)
    if problems:
        raise StateMismatchError(
            "this state does not fit the loader: it was saved for " + "; ".join(problems)
        )
    return Cursor(position, sub, skip)


def _elastic(saved: dict, now: dict, position: int, sub: int, skip: int) -> tuple[int, str | None]:
    """Maps a position across shard counts, or says why it cannot."""
    h0, b0, h1, b1 = saved["shard_count"], saved["batch_size"], now["shard_count"], now["batch_size"]
    where = f"shard_count={h0} with batch_size={b0}, but this loader has shard_count={h1} with batch_size={b1}"
    if now["layout"] != BATCH or b0 is None or b1 is None:
        return position, (
            f"{where}; a different shard count needs a plain Batch with no filter or flat "
            f"map before it (elastic restore)"
        )
    if b0 * h0 != b1 * h1:
        return position, (
            f"{where}; the global batch must stay the same, so use batch_size="
            f"{b0 * h0 / h1:g} on {h1} shards"
        )
    if sub or skip or (position * h0) % (b1 * h1):
        return position, f"{where}; the state is not at a global batch boundary"
    return position * h0 // h1, None
