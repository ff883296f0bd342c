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

:func:`verify` re-reads one step's records by their keys (one batch, no replay), in this
process, and raises :class:`~dataloader.errors.StateMismatchError` naming the records
whose bytes changed, or saying that the operations' output changed.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import pickle
import zlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from dataloader.engine.plan import BATCH, Plan
from dataloader.errors import PipelineError, StateMismatchError
from dataloader.samplers import ShardOptions
from dataloader.sources import read_records

FINGERPRINT_VERSION = 1
KEY = "fingerprint"
# Records named in a refusal; more are counted, not listed.
_SHOWN = 8


# Numpy scalar types whose dtype is fixed by the type (np.int64, np.bool_...; not
# datetime64, whose unit varies, nor np.void), and the header of their 0-d array.
_SCALAR_HEADS: dict[type, bytes] = {}
# Dicts whose keys are all str, by their keys in order: the keys sorted as _feed sorts
# them, each with its bytes (a stream's records share a few key sets).
_KEY_ORDERS: dict[tuple[str, ...], tuple[tuple[str, bytes], ...]] = {}
_KEY_ORDERS_HELD = 256


def _feed(out: list[Any], obj: Any) -> None:
    """Appends the bytes that stand for ``obj``'s content to ``out``, tagged by kind so
    that ``b"1"``, ``"1"`` and ``1`` differ. Deterministic across processes (sets are
    ordered by their members' digests: string hashing is salted per process)."""
    kind = type(obj)
    # The usual fields of records and elements first, by their exact type.
    if kind is str:
        data = obj.encode("utf-8", "surrogatepass")
        out += (b"s%d:" % len(data), data)
        return
    head = _SCALAR_HEADS.get(kind)
    if head is not None:  # as its 0-d array, below
        out += (head, obj.tobytes())
        return
    if isinstance(obj, (bytes, bytearray, memoryview)):
        out += (b"b%d:" % len(obj), obj)
    elif isinstance(obj, np.ndarray):
        if obj.dtype.hasobject:
            out.append(b"O%r:" % (obj.shape,))
            for x in obj.reshape(-1):
                _feed(out, x)
        else:
            out += (f"a{obj.dtype.str}{obj.shape}:".encode(), np.ascontiguousarray(obj).view(np.uint8).reshape(-1))
    elif isinstance(obj, str):
        _feed(out, str(obj))
    elif obj is None or isinstance(obj, (bool, int, float, complex)):
        out.append(f"n{kind.__name__}{obj!r};".encode())
    elif isinstance(obj, np.generic):
        array = np.asarray(obj)
        _feed(out, array)
        if isinstance(obj, (np.number, np.bool_)) and not array.dtype.hasobject:
            _SCALAR_HEADS[kind] = f"a{array.dtype.str}():".encode()
    elif isinstance(obj, dict):
        out.append(b"d%d:" % len(obj))
        keys = tuple(obj)
        order = _KEY_ORDERS.get(keys) if kind is dict else None
        if order is None:
            if kind is not dict or not all(type(k) is str for k in keys):
                for key in sorted(obj, key=repr):
                    _feed(out, key)
                    _feed(out, obj[key])
                return
            order = tuple((k, b"".join(_pieces(k))) for k in sorted(keys, key=repr))
            if len(_KEY_ORDERS) < _KEY_ORDERS_HELD:
                _KEY_ORDERS[keys] = order
        for key, tag in order:
            out.append(tag)
            _feed(out, obj[key])
    elif isinstance(obj, (list, tuple)):
        out.append(b"l%d:" % len(obj))
        for x in obj:
            _feed(out, x)
    elif isinstance(obj, (set, frozenset)):
        out.append(b"S%d:" % len(obj))
        out += (d.to_bytes(8, "little") for d in sorted(digest(x) for x in obj))
    else:  # anything else by its pickle (a dataclass, an object of the user's)
        try:
            data = pickle.dumps(obj, protocol=5)
        except Exception:
            # Not picklable (a lambda, a lock, a generator): only its type can be told.
            # The hash must not fail here: with workers the transport then names the
            # record and operation behind the object, which is the error the user needs.
            out.append(f"u{kind.__module__}.{kind.__qualname__};".encode())
            return
        out += (b"p:", data)


def _pieces(obj: Any) -> list[Any]:
    out: list[Any] = []
    _feed(out, obj)
    return out


def digest(obj: Any) -> int:
    """A 64-bit digest of ``obj``'s content (bytes, arrays, str, numbers, dicts, lists...):
    CRC-32 and Adler-32 of the same bytes, side by side, 64 bits that change with any
    accidental change of the data (what a fingerprint is for; it is no defence against
    someone forging data), at 4-8 times the speed of ``hashlib.blake2b`` (measured on
    1 KiB records and 64 KiB batches, benchmarks/fingerprint.py).

    Example:
        >>> digest({"a": b"x"}) == digest({"a": b"x"}) != digest({"a": b"y"})
        True
    """
    # The usual records and elements: what _feed does, without its calls.
    kind = type(obj)
    if kind is bytes or (kind is np.ndarray and obj.flags.c_contiguous and not obj.dtype.hasobject):
        head = b"b%d:" % len(obj) if kind is bytes else f"a{obj.dtype.str}{obj.shape}:".encode()
        try:
            return zlib.crc32(obj, zlib.crc32(head)) | (zlib.adler32(obj, zlib.adler32(head)) << 32)
        except (BufferError, TypeError, ValueError):  # a dtype with no buffer format (datetime64)
            pass
    parts = _pieces(obj)
    # Both checksums of a concatenation are those of its pieces fed one after another:
    # the small pieces (tags, strings, scalars) are hashed joined, one call for a
    # record's few dozen; arrays' and buffers' bytes are hashed where they lie.
    crc, adler, run = 0, 1, []
    for part in parts:
        if type(part) is bytes:
            run.append(part)
            continue
        if run:
            joined = b"".join(run)
            crc, adler, run = zlib.crc32(joined, crc), zlib.adler32(joined, adler), []
        crc, adler = zlib.crc32(part, crc), zlib.adler32(part, adler)
    if run:
        joined = b"".join(run)
        crc, adler = zlib.crc32(joined, crc), zlib.adler32(joined, adler)
    return crc | (adler << 32)


def digests(objs: Sequence[Any]) -> np.ndarray:
    """:func:`digest` of each object, as a uint64 array (what a unit ships)."""
    return np.fromiter((digest(x) for x in objs), dtype=np.uint64, count=len(objs))


def combine(values: np.ndarray) -> str:
    """One hex digest of an ordered run of digests."""
    data = np.ascontiguousarray(values, dtype="<u8").tobytes()
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def _pack(sources: np.ndarray) -> str:
    return base64.b64encode(np.asarray(sources, dtype=np.uint64).astype("<u4").tobytes()).decode()


def _unpack(text: str) -> np.ndarray:
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
    (``local_skips`` of an :class:`~dataloader.engine.elastic.ElasticSampler`)."""
    skips = getattr(plan.sampler, "local_skips", None) or {}
    return sorted((q, sub) for (q, sub), used in skips.items() if used is None and lo <= q < hi)


def _keep_undropped(fingerprint: dict[str, Any], pos: np.ndarray, subs: np.ndarray, shift: int = 0) -> np.ndarray:
    """Which of the outputs tagged ``(pos, subs)`` the saved step did not drop
    (``shift``: added to the saved positions to give ``pos``'s)."""
    keep = np.ones(len(pos), dtype=bool)
    for q, sub in fingerprint.get("dropped", ()):
        keep &= ~((pos == q + shift) & (subs == sub))
    return keep


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
    whole = getattr(plan.sampler, "base", plan.sampler).with_shard_options(ShardOptions(0, 1))
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
        sources = _unpack(fingerprint["sources"])
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


def _shown(keys: Sequence[int]) -> str:
    listed = ", ".join(str(int(k)) for k in keys[:_SHOWN])
    return listed + (f" and {len(keys) - _SHOWN} more" if len(keys) > _SHOWN else "")


def recompute(plan: Plan, fingerprint: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, str]:
    """Reads a fingerprint's records again and recomputes its step, in this process.

    Returns:
        The record indices, their source digests (uint64) and the output digest.
    """
    from dataloader.engine.compute import apply_element_ops

    count, local_start = fingerprint["count"], fingerprint["local_start"]
    glob = global_positions(fingerprint)
    keys = record_keys(plan, fingerprint)
    records = read_records(plan.source, keys)
    sources = digests(records)

    def rng_keys(positions: np.ndarray) -> np.ndarray:
        # The saved shard's local positions back to global ones: random maps draw the
        # same numbers on any host count.
        return glob[np.asarray(positions, dtype=np.int64) - local_start]

    def fail(op: Any, position: int, sub: int, exc: BaseException) -> BaseException:
        key = int(keys[position - local_start]) if 0 <= position - local_start < count else -1
        return PipelineError(
            f"{op.name} failed on record {key} while the restore re-read the state's last "
            f"step: {type(exc).__name__}: {exc}",
            operation=op.name, record_index=key, position=position,
        )

    elements, pos, subs = apply_element_ops(plan.pre, list(records), None, None, local_start, fail, rng_keys=rng_keys)
    if "output_index" in fingerprint:
        assert plan.batch is not None and plan.layout == BATCH
        outputs: list[Any] = [plan.batch.batch_fn(elements)]
        if plan.post:
            one = np.asarray([local_start], dtype=np.int64)
            outputs, _, _ = apply_element_ops(
                plan.post, outputs, one, np.zeros(1, dtype=np.int64), local_start, fail, rng_keys=rng_keys
            )
        index = fingerprint["output_index"]
        output = combine(digests(outputs[index : index + 1]))
        return keys, sources, output
    n = len(elements)
    pos = pos if pos is not None else np.arange(local_start, local_start + n, dtype=np.int64)
    subs = subs if subs is not None else np.zeros(n, dtype=np.int64)
    p0, s0, p1, s1 = fingerprint["select"]
    keep = ((pos > p0) | ((pos == p0) & (subs >= s0))) & ((pos < p1) | ((pos == p1) & (subs <= s1)))
    keep &= _keep_undropped(fingerprint, pos, subs)
    chosen = [x for x, k in zip(elements, keep.tolist()) if k]
    return keys, sources, combine(digests(chosen))


def verify(plan: Plan, fingerprint: dict[str, Any]) -> None:
    """Re-reads the state's last step and refuses a restore whose data or operations
    changed since the state was saved.

    Raises:
        StateMismatchError: naming the records whose source bytes differ, or saying that
            the operations' output differs (the records read the same).
    """
    _, sources, output = recompute(plan, fingerprint)
    compare(plan, fingerprint, sources, output)


def compare(plan: Plan, fingerprint: dict[str, Any], sources: np.ndarray, output: str) -> None:
    """Refuses a restore whose recomputed step (its records' ``sources`` digests and its
    ``output`` digest, computed wherever) differs from the saved ``fingerprint``.

    Raises:
        StateMismatchError: as :func:`verify`.
    """
    keys = record_keys(plan, fingerprint)
    saved = _unpack(fingerprint["sources"])
    changed = np.flatnonzero(sources.astype(np.uint32) != saved)
    step = fingerprint.get("step")
    which = f"step {step}" if step is not None else "the last step"
    undo = (
        "restore the data and code the state was saved with, start from scratch, or pass "
        "verify_on_restore=False to the DataLoader to resume anyway"
    )
    if changed.size:
        raise StateMismatchError(
            f"the state's fingerprint does not match the data: the source bytes of "
            f"record{'s' if changed.size > 1 else ''} {_shown(keys[changed].tolist())} "
            f"({changed.size} of the {len(keys)} records of {which}) differ from when the "
            f"state was saved (a data file rewritten under the same name?); {undo}"
        )
    if output != fingerprint["output"]:
        raise StateMismatchError(
            f"the state's fingerprint does not match the pipeline: the {len(keys)} records "
            f"of {which} ({_shown(keys.tolist())}) read the same bytes, but the operations' "
            f"output differs (output digest {output}, saved {fingerprint['output']}): a "
            f"changed map, filter, tokenizer or batch function?; {undo}"
        )


def covering(units: Iterator[Any], start: int, count: int) -> list[Any]:
    """Unit results from ``units`` (an executor reset to ``start``) until they cover
    positions ``[start, start + count)``: what the check reads. An error of a record in
    that range is raised (it names the record and operation); a later one stays with its
    unit, for the stream to raise where it comes."""
    got: list[Any] = []
    while not got or got[-1].stop < start + count:
        try:
            r = next(units)
        except StopIteration:
            break
        if r.error is not None and r.stop < start + count:
            raise r.error
        got.append(r)
    return got


def from_units(fingerprint: dict[str, Any], units: Sequence[Any], start: int) -> tuple[np.ndarray, str]:
    """The source digests and the output digest of a fingerprint's step, from the unit
    results that computed it wherever they were computed (worker processes).

    Args:
        units: consecutive unit results from ``start`` on, with digests, covering the
            step's ``count`` positions (:func:`covering`).
        start: the units' position of the step's first record: the saved
            ``local_start`` on the stream the state was saved on, 0 on a
            :class:`StepSampler`'s.

    Raises:
        StateMismatchError: the stream ends before the step's last record.
    """
    count = fingerprint["count"]
    lo, hi = start, start + count
    parts = [r.sources[max(lo, r.start) - r.start : min(hi, r.stop) - r.start] for r in units if r.start < hi and r.stop > lo]
    sources = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)
    if len(sources) != count:
        raise StateMismatchError(
            f"the state's fingerprint names {count} records from position {fingerprint['local_start']}, "
            f"but the stream holds {len(sources)} of them: the data set shrank?; restore the "
            f"data the state was saved with, or pass verify_on_restore=False to resume anyway"
        )
    if "output_index" in fingerprint:  # a batch unit is the step's whole range
        index = fingerprint["output_index"]
        return sources, combine(units[0].digests[index : index + 1])
    shift = start - fingerprint["local_start"]
    p0, s0, p1, s1 = fingerprint["select"]
    p0, p1 = p0 + shift, p1 + shift
    chosen = []
    for r in units:
        pos, subs = r.tags()
        keep = ((pos > p0) | ((pos == p0) & (subs >= s0))) & ((pos < p1) | ((pos == p1) & (subs <= s1)))
        keep &= _keep_undropped(fingerprint, pos, subs, shift)
        chosen.append(np.asarray(r.digests)[np.asarray(keep, dtype=bool)])
    return sources, combine(np.concatenate(chosen))


class StepSampler:
    """A sampler over one fingerprint's records only: local position ``i`` is its
    ``i``-th record, at its global position (so random maps draw the same numbers).
    What an executor computes to check a step the iterator's own stream does not hold
    (an old host's state, in an elastic restore).

    Args:
        base: the sampler of the global order (read unsharded).
        positions: the step's global positions.
    """

    def __init__(self, base: Any, positions: np.ndarray) -> None:
        self.base = base.with_shard_options(ShardOptions(0, 1))
        self.shard_options = ShardOptions(0, 1)
        self._positions = np.asarray(positions, dtype=np.int64)
        self.num_records = self.base.num_records
        self.shuffle = self.base.shuffle
        self.seed = self.base.seed
        self.num_epochs = self.base.num_epochs
        self.index_map_signature = self.base.index_map_signature
        self.local_skips: dict[tuple[int, int], Any] = {}

    @property
    def num_positions(self) -> int:
        return len(self._positions)

    def global_positions(self, positions: Any) -> np.ndarray:
        return self._positions[np.asarray(positions, dtype=np.int64)]

    def record_keys(self, positions: Any) -> np.ndarray:
        return np.asarray(self.base.record_keys(self.global_positions(positions)), dtype=np.int64)

    def with_shard_options(self, shard_options: ShardOptions) -> StepSampler:
        return self


def verify_on_executor(engine: Any, fingerprints: Sequence[dict[str, Any]]) -> None:
    """:func:`verify` of each fingerprint, with the steps computed by one new executor
    of ``engine``'s kind (worker processes: no user code runs in this process) over a
    :class:`StepSampler` of their records one after the other.

    Raises:
        StateMismatchError: as :func:`verify`, for the first fingerprint that differs.
    """
    from dataloader.engine import elastic

    plan = engine.plan
    counts = [fp["count"] for fp in fingerprints]
    if plan.layout == BATCH and len(set(counts)) > 1:  # a batch unit is one step: one size each
        for fp in fingerprints:
            verify_on_executor(engine, [fp])
        return
    if not fingerprints:
        return
    offsets = np.cumsum([0, *counts]).tolist()
    positions = np.concatenate([global_positions(fp) for fp in fingerprints])
    sampler = StepSampler(getattr(plan.sampler, "base", plan.sampler), positions)
    # A batch unit is the saved step's batch, whatever this loader's batch size;
    # fingerprint=True: the units carry digests even where states do not.
    size = counts[0] if plan.layout == BATCH else plan.unit_size
    check = dataclasses.replace(engine, plan=dataclasses.replace(plan, unit_size=size, fingerprint=True))
    executor = elastic.with_sampler(check, sampler).make_executor(0)
    try:
        units = covering(executor, 0, offsets[-1])
    finally:
        executor.close()
    for fp, start in zip(fingerprints, offsets):
        stop = start + fp["count"]
        sources, output = from_units(fp, [r for r in units if r.start < stop and r.stop > start], start)
        compare(plan, fp, sources, output)


def describe(plan: Plan, fingerprint: dict[str, Any]) -> dict[str, Any]:
    """A fingerprint with its record indices spelled out (a line of the audit log)."""
    return {**fingerprint, "record_keys": record_keys(plan, fingerprint).tolist()}

