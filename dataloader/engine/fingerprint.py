"""Fingerprints of a step's records, carried in every state and checked on restore.

A state says where the stream continues; its ``"fingerprint"`` says what the last step
handed out was made of, so a restore can tell whether the records it reads now are the
ones the state meant (a data file regenerated under the same name, a changed tokenizer,
map or filter resume silently otherwise)::

    "fingerprint": {"version": 1, "step": 12,
                    "global_start": 352, "stride": 2, "count": 16, "local_start": 176,
                    "sources": "<base64: 32 bits per record>", "output": "9f0c...",
                    "select": [176, 0, 191, 0]}          # or "output_index": 0

- **Keys**: the step's records are a contiguous run of ``count`` local positions of the
  saved shard from ``local_start``, named by their global positions
  ``global_start + i * stride`` (or, where they are no arithmetic progression, after an
  elastic restore's re-layout, the list ``global_positions``), so they name the same
  records on any host count; the record index of each is the sampler's (the
  ``made_for`` check already pins the sampler).
- **Source bytes**: one 32-bit digest (CRC-32) per record of what the source returned.
- **Operations' output**: a 64-bit digest of the step's output: the batch handed out
  (``batch`` layout, ``output_index`` among its unit's outputs), or the elements the
  operations before the batch made from these records between the tags ``select``
  (``[first_position, first_sub, last_position, last_sub]``: ``elements`` and
  ``regroup`` layouts, where a batch is regrouped in the training process).

The digests are computed by whoever computes the unit (a worker, shipped with the
result in :class:`~dataloader.engine.compute.UnitResult`), so the training process only
slices arrays and encodes a few hundred bytes, and only when a state is asked for.

This module is the format: making a fingerprint from a step's units, checking one read
from a state, naming its records. The check on restore (re-reading the step, in this
process or in workers) is the restore room's: :mod:`dataloader.engine.restore.verify`.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from dataloader.engine.digest import combine
from dataloader.engine.plan import Plan
from dataloader.engine.restore.samplers import order_of, skips_of
from dataloader.errors import StateMismatchError
from dataloader.samplers import ShardOptions

FINGERPRINT_VERSION = 1
KEY = "fingerprint"


def _pack(sources: np.ndarray) -> str:
    return base64.b64encode(np.asarray(sources, dtype=np.uint64).astype("<u4").tobytes()).decode()


def unpack_sources(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype="<u4").astype(np.uint32)


def make_fingerprint(
    plan: Plan,
    local_start: int,
    sources: np.ndarray,
    output: str,
    step: int | None,
    *,
    select: tuple[int, int, int, int] | None = None,
    output_index: int | None = None,
    dropped: Sequence[tuple[int, int]] = (),
) -> dict[str, Any]:
    """The JSON-able fingerprint of a step over local positions ``[local_start,
    local_start + len(sources))`` of ``plan``'s stream (see the module docstring).
    ``dropped``: outputs ``(position, sub)`` among them that an elastic restore's layout
    dropped (used before the change), which a recomputation drops too."""
    count = len(sources)
    glob = plan.sampler.global_positions(np.arange(local_start, local_start + count, dtype=np.int64))
    stride = int(glob[1] - glob[0]) if count > 1 else 1
    out: dict[str, Any] = {"version": FINGERPRINT_VERSION, "step": step, "global_start": int(glob[0])}
    if stride > 0 and np.array_equal(glob, glob[0] + stride * np.arange(count)):
        out["stride"] = stride
    else:
        out["global_positions"] = glob.tolist()
    out.update(count=count, local_start=int(local_start), sources=_pack(sources), output=output)
    if select is not None:
        out["select"] = [int(v) for v in select]
    if output_index is not None:
        out["output_index"] = int(output_index)
    if dropped:
        out["dropped"] = [[int(q), int(sub)] for q, sub in dropped]
    return out


def _dropped(plan: Plan, lo: int, hi: int) -> list[tuple[int, int]]:
    """The outputs of local positions ``[lo, hi)`` that this stream's elastic layout drops
    (``local_skips`` of an :class:`~dataloader.engine.restore.samplers.ElasticSampler`)."""
    skips = skips_of(plan.sampler)
    return sorted((q, sub) for (q, sub), used in skips.items() if used is None and lo <= q < hi)


def of_step(
    plan: Plan,
    units: Sequence[Any],
    segments: Sequence[tuple[Any, int, int]],
    step: int | None,
    output_index: int | None = None,
) -> dict[str, Any] | None:
    """The fingerprint of a step from the unit results it came from (an assembler's
    ``last_step()``); None when the units carry no digests (fingerprints off).

    Args:
        units: the unit results whose positions the step spans, in stream order (units
            whose every record was filtered out included).
        segments: ``(unit, i, j)``: the step's outputs are ``unit.outputs[i:j]``, in order.
        output_index: ``batch`` layout: the step is output ``i`` of its one unit, and
            spans the unit's whole range.
    """
    if not segments or any(r.sources is None for r in units):
        return None
    if output_index is not None:
        r = segments[0][0]
        return make_fingerprint(
            plan, r.start, r.sources, combine(r.digests[output_index : output_index + 1]), step,
            output_index=output_index,
        )
    (first, i0, _), (last, _, j1) = segments[0], segments[-1]
    p0, s0 = (int(t[i0]) for t in first.tags())
    p1, s1 = (int(t[j1 - 1]) for t in last.tags())
    lo, hi = p0, p1 + 1
    sources = np.concatenate([
        r.sources[max(lo, r.start) - r.start : min(hi, r.stop) - r.start]
        for r in units if r.start < hi and r.stop > lo
    ])
    output = combine(np.concatenate([r.digests[i:j] for r, i, j in segments]))
    return make_fingerprint(plan, lo, sources, output, step, select=(p0, s0, p1, s1), dropped=_dropped(plan, lo, hi))


def global_positions(fingerprint: dict[str, Any]) -> np.ndarray:
    """The global positions of a fingerprint's records."""
    if "global_positions" in fingerprint:
        return np.asarray(fingerprint["global_positions"], dtype=np.int64)
    return fingerprint["global_start"] + fingerprint["stride"] * np.arange(fingerprint["count"], dtype=np.int64)


def record_keys(plan: Plan, fingerprint: dict[str, Any]) -> np.ndarray:
    """The record indices of a fingerprint's records, on any shard layout: global
    positions read through the sampler unsharded (an elastic restore's sampler reads
    through its ``base``, the global order)."""
    whole = order_of(plan.sampler).with_shard_options(ShardOptions(0, 1))
    return whole.record_keys(global_positions(fingerprint))


def _is_int(v: Any, low: int = 0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= low


def check(fingerprint: Any) -> dict[str, Any]:
    """Refuses a ``"fingerprint"`` get_state() cannot have made, naming the field."""

    def bad(field: str, expected: str) -> StateMismatchError:
        value = fingerprint.get(field) if isinstance(fingerprint, dict) else fingerprint
        return StateMismatchError(
            f"state field fingerprint{'.' + field if field else ''}={value!r} is invalid: "
            f"expected {expected}; pass the state get_state() returned unchanged, or drop "
            f"its 'fingerprint' key to restore without the check"
        )

    if not isinstance(fingerprint, dict):
        raise bad("", "a dict")
    if fingerprint.get("version") != FINGERPRINT_VERSION:
        raise bad("version", f"{FINGERPRINT_VERSION}")
    for field, low in (("global_start", 0), ("count", 1), ("local_start", 0)):
        if not _is_int(fingerprint.get(field), low):
            raise bad(field, f"an integer >= {low}")
    listed = fingerprint.get("global_positions")
    if listed is None and not _is_int(fingerprint.get("stride"), 1):
        raise bad("stride", "an integer >= 1 (or a list global_positions)")
    if listed is not None and not (
        isinstance(listed, list) and len(listed) == fingerprint["count"] and all(_is_int(g) for g in listed)
    ):
        raise bad("global_positions", f"a list of {fingerprint['count']} integers >= 0 (count)")
    step = fingerprint.get("step")
    if step is not None and not _is_int(step):
        raise bad("step", "an integer >= 0 or null")
    output = fingerprint.get("output")
    if not isinstance(output, str) or len(output) != 16:
        raise bad("output", "16 hex digits")
    try:
        sources = unpack_sources(fingerprint["sources"])
    except (KeyError, TypeError, ValueError):
        raise bad("sources", "base64 text") from None
    if len(sources) != fingerprint["count"]:
        raise bad("sources", f"{fingerprint['count']} digests of 4 bytes (count)")
    select = fingerprint.get("select")
    index = fingerprint.get("output_index")
    if (select is None) == (index is None):
        raise bad("select", "either select or output_index")
    if select is not None and not (isinstance(select, list) and len(select) == 4 and all(map(_is_int, select))):
        raise bad("select", "[first_position, first_sub, last_position, last_sub]")
    if index is not None and not _is_int(index):
        raise bad("output_index", "an integer >= 0")
    dropped = fingerprint.get("dropped", [])
    if not (isinstance(dropped, list) and all(isinstance(d, list) and len(d) == 2 and all(map(_is_int, d))
                                              for d in dropped)):
        raise bad("dropped", "a list of [position, sub] pairs")
    return fingerprint


def fingerprint_of(state: Any) -> dict[str, Any] | None:
    """The fingerprint of a state (dict or JSON text), or None when it has none."""
    if isinstance(state, (str, bytes, bytearray)):
        try:
            state = json.loads(state)
        except ValueError:
            return None
    if isinstance(state, dict) and state.get(KEY) is not None:
        return check(state[KEY])
    return None


def describe(plan: Plan, fingerprint: dict[str, Any]) -> dict[str, Any]:
    """A fingerprint with its record indices spelled out (a line of the audit log)."""
    return {**fingerprint, "record_keys": record_keys(plan, fingerprint).tolist()}




class AuditLog:
    """The audit log of one shard's stream: a JSON line per step (``audit_log=`` of a
    loader; ``{shard}`` in the path is the shard index), opened at the first step.

    Each line is the state after the step with ``shard``, ``step`` and the fingerprint
    with its record indices spelled out (:func:`describe`).
    """

    def __init__(self, path: str) -> None:
        self._path = path
        self._file: Any = None

    def write(self, plan: Plan, state: dict[str, Any], step: int | None) -> None:
        line = dict(state)
        fp = line.pop(KEY, None)
        shard = line.pop("made_for")["shard_index"]
        line.update(shard=shard, step=step)
        line[KEY] = None if fp is None else describe(plan, fp)
        if self._file is None:
            self._file = open(self._path.replace("{shard}", str(shard)), "a", buffering=1)  # noqa: SIM115
        self._file.write(json.dumps(line, separators=(",", ":")) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
