"""Digests of records and outputs: 64 bits of content, the same in every process.

What a unit computes beside its outputs when fingerprints are on (a digest of each
record read and of each output, :mod:`~dataloader.engine.compute`), and what a state's
fingerprint is made of (:mod:`~dataloader.engine.fingerprint`). Pure functions of the
content, with no state and no imports of the engine, so the computing code and the
fingerprint format both depend on this module and not on each other.
"""

from __future__ import annotations

import hashlib
import pickle
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

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

