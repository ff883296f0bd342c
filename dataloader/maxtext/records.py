"""``tf.train.Example`` records without TensorFlow: MaxText's ArrayRecord data sets.

MaxText's Grain pipeline reads ArrayRecord files whose records are serialized
``tf.train.Example`` protocol buffers (what TFDS and Beam write), and parses them with
TensorFlow. Their wire format is small and fixed, so it is decoded here directly::

    Example   { Features features = 1; }
    Features  { map<string, Feature> feature = 1; }     (entries: key = 1, value = 2)
    Feature   { oneof { BytesList bytes_list = 1; FloatList float_list = 2;
                        Int64List int64_list = 3; } }   (each: repeated value = 1)

:func:`parse_example` gives ``{name: list of bytes | float32 array | int64 array}``;
:func:`encode_example` writes the same bytes TensorFlow does (packed numbers), for tests
and for writing such data without TensorFlow.

Example:
    >>> record = encode_example({"text": [b"hello"], "ids": np.array([1, 2])})
    >>> parsed = parse_example(record)
    >>> parsed["text"], parsed["ids"].tolist()
    ([b'hello'], [1, 2])
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

_VARINT, _FIXED64, _LEN, _FIXED32 = 0, 1, 2, 5


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(data):
            raise ValueError("a tf.train.Example record ends inside a number; is it one?")
        byte = data[i]
        value |= (byte & 0x7F) << shift
        i += 1
        if byte < 0x80:
            return value, i
        shift += 7


def _fields(data: bytes) -> list[tuple[int, int, Any]]:
    """(field number, wire type, value) of a message; LEN values as bytes."""
    out: list[tuple[int, int, Any]] = []
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == _VARINT:
            value, i = _varint(data, i)
        elif wire == _LEN:
            size, i = _varint(data, i)
            value, i = data[i : i + size], i + size
        elif wire == _FIXED32:
            value, i = data[i : i + 4], i + 4
        elif wire == _FIXED64:
            value, i = data[i : i + 8], i + 8
        else:
            raise ValueError(f"not a tf.train.Example record (wire type {wire} at byte {i})")
        out.append((number, wire, value))
    return out


def _int64s(fields: list[tuple[int, int, Any]]) -> np.ndarray:
    values: list[int] = []
    for _, wire, value in fields:
        if wire == _LEN:  # packed
            i = 0
            while i < len(value):
                v, i = _varint(value, i)
                values.append(v)
        else:
            values.append(value)
    return np.asarray(values, dtype=np.uint64).astype(np.int64)  # two's complement


def _floats(fields: list[tuple[int, int, Any]]) -> np.ndarray:
    raw = b"".join(value for _, _, value in fields)  # packed or not, 4 bytes each
    return np.frombuffer(raw, dtype="<f4").astype(np.float32)


def parse_example(record: bytes) -> dict[str, Any]:
    """The features of a serialized ``tf.train.Example`` (see the module docstring).

    Raises:
        ValueError: the bytes are not such a record.
    """
    out: dict[str, Any] = {}
    for number, _, features in _fields(bytes(record)):
        if number != 1:
            continue
        for entry_number, _, entry in _fields(features):
            if entry_number != 1:
                continue
            parts = {n: v for n, _, v in _fields(entry)}
            name = parts.get(1, b"").decode("utf-8")
            kinds = _fields(parts.get(2, b""))
            value: Any = []
            for kind, _, payload in kinds:
                inner = [f for f in _fields(payload) if f[0] == 1]
                if kind == 1:
                    value = [bytes(v) for _, _, v in inner]
                elif kind == 2:
                    value = _floats(inner)
                elif kind == 3:
                    value = _int64s(inner)
            out[name] = value
    return out


def _len_field(number: int, payload: bytes) -> bytes:
    return _encode_varint((number << 3) | _LEN) + _encode_varint(len(payload)) + payload


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode_example(features: Mapping[str, Any]) -> bytes:
    """A serialized ``tf.train.Example``: lists of bytes/str, or arrays of ints or floats."""
    entries = b""
    for name, value in features.items():
        if isinstance(value, (bytes, str)):
            value = [value]
        array = None if isinstance(value, list) and value and isinstance(value[0], (bytes, str)) else np.asarray(value)
        if array is None:
            payload = b"".join(_len_field(1, v.encode() if isinstance(v, str) else v) for v in value)
            feature = _len_field(1, payload)
        elif array.dtype.kind == "f":
            feature = _len_field(2, _len_field(1, array.astype("<f4").tobytes()))
        else:
            packed = b"".join(_encode_varint(int(v)) for v in array.reshape(-1))
            feature = _len_field(3, _len_field(1, packed))
        entries += _len_field(1, _len_field(1, name.encode()) + _len_field(2, feature))
    return _len_field(1, entries)
