"""``python -m dataloader audit LOG_A LOG_B``: the first step where two audit logs differ.

A loader made with ``DataLoader(..., audit_log=path)`` appends one JSON line per step:
the state after the step (``position``, ``sub_index``, ``skip``), its ``shard``, its
``step`` number and the step's fingerprint (record keys, a digest of each record's bytes,
a digest of the operations' output; see :mod:`dataloader.engine.fingerprint`). Two logs
(a run and its restarted continuation, two runs of the same config, two worker counts)
are lined up by the state after each step, which is the same whatever the worker count
and across restarts; a log that holds a step twice (a restarted run that appended to
it) has both lines checked. The report names the first step, in stream order, where
they differ and what differs: the records read, their bytes, or the operations' output.

Exit status: 0 when every step both logs hold is the same, 1 at a difference (or when
they share no step), 2 when a log cannot be read.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any, NamedTuple

# Shown at most, of the records that differ.
_SHOWN = 8


class AuditError(ValueError):
    """A log that is not an audit log (the message names the file and the line)."""


class Step(NamedTuple):
    """One line of a log: where it is and what it says."""

    key: tuple[int, int, int, int]  # (shard, position, sub_index, skip): the state after the step
    step: int | None
    fingerprint: dict[str, Any] | None
    where: str  # "path:line"


def read_log(path: str) -> list[Step]:
    """The lines of an audit log.

    Raises:
        AuditError: a line is not JSON or lacks a field, naming the file and line.
        FileNotFoundError: no such file.
    """
    steps = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                entry = json.loads(line)
                key = (int(entry["shard"]), int(entry["position"]), int(entry["sub_index"]), int(entry["skip"]))
            except (ValueError, KeyError, TypeError) as exc:
                raise AuditError(
                    f"{where} is not a line of an audit log ({type(exc).__name__}: {exc}): "
                    f"{line[:120]!r}; pass files written by DataLoader(..., audit_log=path)"
                ) from None
            steps.append(Step(key, entry.get("step"), entry.get("fingerprint"), where))
    return steps


def _digests(fingerprint: dict[str, Any]) -> list[int]:
    data = base64.b64decode(fingerprint.get("sources", ""))
    return [int.from_bytes(data[i : i + 4], "little") for i in range(0, len(data), 4)]


def _shown(keys: Sequence[Any]) -> str:
    return ", ".join(map(str, keys[:_SHOWN])) + (f" and {len(keys) - _SHOWN} more" if len(keys) > _SHOWN else "")


def what_differs(a: dict[str, Any] | None, b: dict[str, Any] | None) -> str | None:
    """What differs between two fingerprints of the same step, or None if nothing does."""
    if a is None or b is None:
        if a is None and b is None:
            return None
        return f"only {'the second' if a is None else 'the first'} log has a fingerprint for it"
    keys_a, keys_b = a.get("record_keys"), b.get("record_keys")
    if keys_a != keys_b or any(a.get(f) != b.get(f) for f in ("global_start", "stride", "global_positions", "count")):
        if keys_a is not None and keys_b is not None and len(keys_a) == len(keys_b):
            pairs = [f"{x} vs {y}" for x, y in zip(keys_a, keys_b) if x != y]
            return f"the records read differ: {_shown(pairs)}"
        return (
            f"the records read differ: {len(keys_a or [])} records "
            f"({_shown(keys_a or [])}) vs {len(keys_b or [])} ({_shown(keys_b or [])})"
        )
    if a.get("sources") != b.get("sources"):
        changed = [k for k, x, y in zip(keys_a or [], _digests(a), _digests(b)) if x != y]
        return f"the source bytes of records {_shown(changed)} differ (same record keys)"
    if a.get("output") != b.get("output") or a.get("select") != b.get("select"):
        return (
            f"the records and their bytes are the same, but the operations' output differs "
            f"({a.get('output')} vs {b.get('output')}): a changed map, filter, tokenizer or batch?"
        )
    return None


def _describe(step: Step) -> str:
    shard, position, sub, skip = step.key
    at = f"position {position}" + (f", sub_index {sub}" if sub else "") + (f", skip {skip}" if skip else "")
    number = f"step {step.step}" if step.step is not None else "a step"
    return f"{number} (shard {shard}, state after it at {at})"


def compare(a: list[Step], b: list[Step]) -> tuple[str, bool]:
    """Compares two logs; returns the report and whether they differ."""
    lines: dict[tuple[int, int, int, int], list[Step]] = {}
    for step in a + b:
        lines.setdefault(step.key, []).append(step)
    in_a, in_b = {s.key for s in a}, {s.key for s in b}
    common = in_a & in_b
    if not common:
        return (
            f"the logs share no step ({len(a)} and {len(b)} lines): nothing to compare; "
            f"pass logs of the same shard of the same stream", True,
        )
    # In stream order: a later state comes after.
    for key in sorted(common | {k for k, v in lines.items() if len(v) > 1}):
        group = lines[key]
        first = group[0]
        for other in group[1:]:
            differs = what_differs(first.fingerprint, other.fingerprint)
            if differs is not None:
                return (
                    f"first difference at {_describe(first)}: {differs}\n"
                    f"  {first.where}\n  {other.where}", True,
                )
    only = f"; {len(in_a - in_b)} only in the first, {len(in_b - in_a)} only in the second" if in_a != in_b else ""
    return f"the logs agree on all {len(common)} steps they share{only}", False


def audit_command(args: Sequence[str]) -> tuple[str, int]:
    """``audit LOG_A LOG_B``: the report and the exit status."""
    if len(args) != 2:
        return f"audit needs two log files, got {len(args)}: {' '.join(args)}; run: audit LOG_A LOG_B", 2
    try:
        report, differ = compare(read_log(args[0]), read_log(args[1]))
    except (AuditError, OSError) as exc:
        return f"audit: {exc}", 2
    return report, 1 if differ else 0
