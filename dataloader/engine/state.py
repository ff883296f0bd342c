"""The iterator's state: where the stream continues, and what the state was made for.

A state is a small JSON-able dict (no data, no per-worker fields)::

    {"version": 1, "position": 1280, "sub_index": 0, "skip": 0,
     "made_for": {"num_records": ..., "seed": ..., "shard_count": ..., ...}}

``position`` is the local position (in this shard's stream) of the first record whose
outputs the user has not fully received; ``sub_index`` how many outputs of that
position were already handed out (after a flat map); ``skip`` how many outputs of the
next batch's post-batch operations were handed out. Restoring computes from
``position`` on: O(1), no replay.

Elastic restore, from one state: with a plain ``Batch`` (no filter or flat map before
it), a state saved on ``H`` shards at per-shard batch ``B`` restores on ``H'`` shards at
``B' = B*H/H'``: global batch ``k`` is global positions ``[k*B*H, (k+1)*B*H)`` for every
``H``, so position ``p`` becomes ``p*H/H'``.

Elastic restore, from every host's state (any pipeline; :mod:`dataloader.engine.restore`):
the positions no old host used (below the highest host's position, those other hosts
had not reached, and a begun flat-map position with the outputs it gave) are dealt out
first, in global order, round-robin over the new hosts, then the positions above, also
round-robin. The state then also has ``"elastic": {"frontier", "extra", "partial"}``,
that layout (arithmetic progressions of global positions, O(H) numbers), and restores
only on a loader reading that layout.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from dataloader.engine.plan import BATCH, ELEMENTS, REGROUP, Plan
from dataloader.engine.restore.samplers import layout_of
from dataloader.errors import StateMismatchError
from dataloader.operations.transforms import MANY

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


def _optional_int(low: int) -> Any:
    return lambda v: v is None or (_is_int(v) and v >= low)


# made_for's fields: a check of each value, and what the check expects.
_MADE_FOR: dict[str, tuple[Any, str]] = {
    "num_records": (lambda v: _is_int(v) and v >= 0, "an integer >= 0"),
    "shuffle": (lambda v: isinstance(v, bool), "true or false"),
    "seed": (lambda v: v is None or _is_int(v), "an integer or null"),
    "num_epochs": (_optional_int(1), "an integer >= 1 or null"),
    "shard_index": (lambda v: _is_int(v) and v >= 0, "an integer >= 0"),
    "shard_count": (lambda v: _is_int(v) and v >= 1, "an integer >= 1"),
    "batch_size": (_optional_int(1), "an integer >= 1 or null"),
    "layout": (lambda v: v in (BATCH, ELEMENTS, REGROUP), f"one of {BATCH}, {ELEMENTS}, {REGROUP}"),
    "operations": (
        lambda v: isinstance(v, list) and all(isinstance(o, str) for o in v),
        "a list of operation names",
    ),
}

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


def _elastic_layout(plan: Plan) -> Any:
    """The layout an elastic restore gave the sampler (None: the plain sharding)."""
    layout = layout_of(plan.sampler)
    return layout.describe() if layout is not None else None


def make_state(plan: Plan, cursor: Cursor) -> dict[str, Any]:
    """The JSON-able state of ``cursor`` in a stream of ``plan``."""
    state = {
        "version": STATE_VERSION,
        "position": int(cursor.position),
        "sub_index": int(cursor.sub_index),
        "skip": int(cursor.skip),
        "made_for": made_for(plan),
    }
    layout = _elastic_layout(plan)
    if layout is not None:  # after an elastic restore: which global positions are left
        state["elastic"] = layout
    return state


_KEYS = ("version", "position", "sub_index", "skip", "made_for")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _refuse(field: str, value: Any, expected: str) -> StateMismatchError:
    return StateMismatchError(
        f"state field {field}={value!r} is invalid: expected {expected}; pass the dict "
        f"get_state() returned (or its JSON text), unchanged"
    )


def _unknown_or_missing(where: str, keys: Any, expected: tuple[str, ...], optional: tuple[str, ...] = ()) -> None:
    unknown = sorted(map(str, set(keys) - {*expected, *optional}))
    missing = [k for k in expected if k not in keys]
    if unknown or missing:
        said = []
        if missing:
            said.append(f"misses {', '.join(missing)}")
        if unknown:
            said.append(f"has unknown keys {', '.join(unknown)}")
        raise StateMismatchError(
            f"{where} {' and '.join(said)}; expected the keys {', '.join(expected)}"
            f"{' (and optionally ' + ', '.join(optional) + ')' if optional else ''}, as "
            f"get_state() makes them"
        )


def _check_made_for(saved: Any) -> None:
    """Refuses a ``made_for`` that get_state() cannot have made, naming the field."""
    if not isinstance(saved, dict):
        raise _refuse("made_for", saved, "a dict describing the loader")
    _unknown_or_missing("state field made_for", saved, tuple(_MADE_FOR), ("index_map",))
    for key, (ok, expected) in _MADE_FOR.items():
        if not ok(saved[key]):
            raise _refuse(f"made_for.{key}", saved[key], expected)
    if saved["shard_index"] >= saved["shard_count"]:
        raise _refuse(
            "made_for.shard_index", saved["shard_index"], f"< shard_count={saved['shard_count']}"
        )
    if "index_map" in saved and not isinstance(saved["index_map"], str):
        raise _refuse("made_for.index_map", saved["index_map"], "a string")


def check_state(state: Any) -> dict[str, Any]:
    """The state (a dict, or its JSON text) as a dict whose every field has the type and
    range get_state() gives; else a :class:`StateMismatchError` naming the field."""
    if isinstance(state, (bytes, bytearray, str)):  # Grain's iterators hand out JSON bytes
        try:
            state = json.loads(state)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            shown = bytes(state[:80]) if not isinstance(state, str) else state[:80]
            raise StateMismatchError(
                f"the state is not valid JSON ({exc}): {shown!r}{'...' if len(state) > 80 else ''}; "
                f"pass the dict get_state() returned or json.dumps of it, whole"
            ) from None
    if not isinstance(state, dict):
        raise StateMismatchError(
            f"expected a state dict from get_state(), got {type(state).__name__}: {str(state)[:200]}"
        )
    version = state.get("version")
    if not _is_int(version) or version != STATE_VERSION:
        raise StateMismatchError(
            f"state version {version!r} is not supported (expected {STATE_VERSION})"
        )
    # "fingerprint": the last step's records, checked by the iterator (engine/fingerprint.py).
    _unknown_or_missing("the state", state, _KEYS, ("fingerprint", "elastic"))
    for key in ("position", "sub_index", "skip"):
        if not _is_int(state[key]) or state[key] < 0:
            raise _refuse(key, state[key], "an integer >= 0")
    _check_made_for(state["made_for"])
    return state


def _last_endless_position(plan: Plan) -> int:
    """The largest local position of an endless stream (``num_epochs=None``): the last
    whose global position ``local * shard_count + shard_index`` fits in an int64."""
    shards = plan.sampler.shard_options
    return (2**63 - 1 - shards.shard_index) // shards.shard_count


def _check_cursor(plan: Plan, cursor: Cursor) -> None:
    """Refuses a cursor outside this loader's stream, or one its pipeline cannot make."""
    end = plan.num_positions
    if end is not None and cursor.position > end:
        raise _refuse(
            "position",
            cursor.position,
            f"a position within this loader's stream, which ends at position {end} (a "
            f"state from a longer stream, e.g. more epochs, does not fit)",
        )
    if end is None and cursor.position > (last := _last_endless_position(plan)):
        # Refused here rather than by the sampler at the first next(): a global position
        # (local * shard_count + shard_index) is an int64, so the endless stream ends there.
        raise _refuse(
            "position",
            cursor.position,
            f"a position in [0, {last}]: this loader's stream repeats for ever, but its "
            f"global positions are 64-bit integers (a state edited by hand, or of another loader?)",
        )
    if cursor.sub_index and not any(s.op.returns == MANY for s in plan.pre):
        raise _refuse("sub_index", cursor.sub_index, "0: no flat map comes before the batch")
    if cursor.skip and not plan.post:
        raise _refuse("skip", cursor.skip, "0: no operation follows the batch")


def resolve_state(plan: Plan, state: Any) -> Cursor:
    """Checks that ``state`` fits ``plan`` and returns where its stream continues.

    Every field is checked first (types, ranges, unknown or missing keys, JSON that
    does not parse), then what the state was made for against this loader, then the
    position against this loader's stream.

    Raises:
        StateMismatchError: naming the invalid field, its value and what was expected,
            or every field that differs from this loader and what to do.
    """
    state = check_state(state)
    saved, now = state["made_for"], made_for(plan)
    problems = [
        f"{key}={saved.get(key)!r} but this loader has {key}={now.get(key)!r} ({_HINTS[key]})"
        for key in (*_EXACT, "index_map")
        if saved.get(key) != now.get(key)
    ]
    if state.get("elastic") != _elastic_layout(plan):
        raise StateMismatchError(
            f"this state was saved after an elastic restore (layout {str(state.get('elastic'))[:120]}), "
            f"and this loader reads {'another layout' if _elastic_layout(plan) else 'the plain sharding'}; "
            f"restore it with loader.iterator(state) (a loader's iterator moves onto the state's "
            f"layout), or on a new host count with loader.iterator([every host's state])"
        )
    position, sub, skip = state["position"], state["sub_index"], state["skip"]
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
    cursor = Cursor(position, sub, skip)
    _check_cursor(plan, cursor)
    return cursor


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
