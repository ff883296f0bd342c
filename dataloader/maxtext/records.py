"""``tf.train.Example`` records without TensorFlow: MaxText's ArrayRecord data sets.

MaxText's Grain pipeline reads ArrayRecord files whose records are serialized
``tf.train.Example`` protocol buffers (what TFDS and Beam write), and parses them with
TensorFlow. Here they are parsed by the ``protobuf`` library, with the messages
declared in :mod:`dataloader.maxtext.example_pb` (TensorFlow's field numbers)::

    Example   { Features features = 1; }
    Features  { map<string, Feature> feature = 1; }     (entries: key = 1, value = 2)
    Feature   { oneof { BytesList bytes_list = 1; FloatList float_list = 2;
                        Int64List int64_list = 3; } }   (each: repeated value = 1)

So a record is accepted exactly when protobuf accepts it (a truncated or damaged one is
refused, never read as a different, shorter one), in time linear in its size.

:func:`parse_example` gives ``{name: list of bytes | float32 array | int64 array}``,
the features in the record's order; :func:`encode_example` writes such a record (packed
numbers, as TensorFlow writes them), for tests and for writing data without TensorFlow.

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
from google.protobuf.message import DecodeError

from dataloader.maxtext.example_pb import Example, has_unknown_fields

_VARINT, _FIXED64, _LEN, _GROUP_START, _GROUP_END, _FIXED32 = 0, 1, 2, 3, 4, 5


def parse_example(record: bytes, *, where: str | None = None) -> dict[str, Any]:
    """The features of a serialized ``tf.train.Example`` (see the module docstring).

    A feature with no list set reads as ``[]``; a name given twice keeps its last value
    (as protobuf's map does) at its first place.

    Args:
        record: the serialized message (any bytes-like object).
        where: names the record in an error, e.g. ``"record 3 of train.array_record"``.

    Raises:
        ValueError: the bytes are not such a record; the message says where they stop
            making sense (a length past the end, a bad number, a name that is not UTF-8).
        TypeError: ``record`` is not bytes-like.
    """
    data = record if isinstance(record, bytes) else bytes(memoryview(record))
    try:
        example = Example.FromString(data)
    except DecodeError as error:
        what = where or "a record"
        raise ValueError(
            f"{what} ({len(data):,} byte{'s' * (len(data) != 1)}) is not a valid tf.train.Example: "
            f"{_problem(data) or str(error)}; check that the data set holds tf.train.Example "
            f"records (record_format) and that the file is not damaged"
        ) from None
    out: dict[str, Any] = {}
    for entry in example.features.feature:
        if has_unknown_fields(entry):  # not a map entry for protobuf either (example_pb)
            continue
        feature = entry.value
        kind = feature.WhichOneof("kind")
        value: Any
        if kind == "bytes_list":
            value = list(feature.bytes_list.value)
        elif kind == "float_list":
            value = np.array(feature.float_list.value, dtype=np.float32)
        elif kind == "int64_list":
            value = np.array(feature.int64_list.value, dtype=np.int64)
        else:
            value = []
        out[entry.key] = value
    return out


def encode_example(features: Mapping[str, Any]) -> bytes:
    """A serialized ``tf.train.Example``: lists of bytes/str, or arrays of ints or floats.

    Features are written in the mapping's order. A bare ``bytes``/``str`` is a list of
    one; an empty list is an empty float list (as an empty ``np.asarray`` is float).

    Raises:
        TypeError: a value is neither text nor numbers; the message names the feature.
    """
    example = Example()
    entries = example.features.feature
    for name, value in features.items():
        feature = entries.add(key=name).value
        if isinstance(value, (bytes, str)):
            value = [value]
        if isinstance(value, list) and value and isinstance(value[0], (bytes, str)):
            feature.bytes_list.value.extend(v.encode() if isinstance(v, str) else v for v in value)
            continue
        array = np.asarray(value).reshape(-1)
        if array.dtype.kind == "f":
            feature.float_list.SetInParent()  # present even when empty
            feature.float_list.value.extend(array.astype(np.float32).tolist())
        elif array.dtype.kind in "biu":
            feature.int64_list.SetInParent()
            # uint64 past 2**63 wraps to two's complement, as int64 on the wire does.
            feature.int64_list.value.extend(array.astype(np.int64).tolist())
        else:
            raise TypeError(
                f"feature {name!r} holds {array.dtype} values; a tf.train.Example holds "
                f"bytes/str (a list of them), integers or floats"
            )
    return example.SerializeToString()


# What a failure looks like: protobuf says only "Error parsing message", so a rejected
# record is walked again here, within the schema's messages, to name the first field that
# does not fit. The walk is linear and never allocates more than the record; protobuf's
# verdict stands whatever it finds.

# message -> {field number: (name, what its bytes hold)}; anything else is skipped.
_NESTED: dict[str, dict[int, tuple[str, str]]] = {
    "Example": {1: ("features", "Features")},
    "Features": {1: ("feature", "FeatureEntry")},
    "FeatureEntry": {1: ("key", "utf-8"), 2: ("value", "Feature")},
    "Feature": {1: ("bytes_list", "list"), 2: ("float_list", "FloatList"), 3: ("int64_list", "Int64List")},
    "FloatList": {1: ("value", "floats")},
    "Int64List": {1: ("value", "varints")},
    "list": {},
}


def _varint(data: bytes, i: int, end: int, what: str) -> tuple[int, int]:
    """(value, next byte) of a varint at ``i``; ValueError past ``end`` or 10 bytes."""
    value = 0
    for n in range(10):
        if i + n >= end:
            raise ValueError(f"{what} at byte {i} runs past the end of its message (byte {end})")
        byte = data[i + n]
        value |= (byte & 0x7F) << (7 * n)
        if byte < 0x80:
            return value, i + n + 1
    raise ValueError(f"{what} at byte {i} is longer than 10 bytes")


def _walk(data: bytes, i: int, end: int, message: str, path: str) -> None:
    fields = _NESTED.get(message, {})
    while i < end:
        start = i
        key, i = _varint(data, i, end, f"{path}a field's key")
        number, wire = key >> 3, key & 7
        name, holds = fields.get(number, (f"field {number}", ""))
        here = f"{path}{name} at byte {start}"
        if number == 0:
            raise ValueError(f"{path}field 0 at byte {start}: no field is numbered 0")
        if wire == _VARINT:
            _, i = _varint(data, i, end, f"{here}: the number")
        elif wire in (_FIXED64, _FIXED32):
            i += 8 if wire == _FIXED64 else 4
            if i > end:
                raise ValueError(f"{here}: a fixed-size number runs past the end (byte {end})")
        elif wire == _LEN:
            size, i = _varint(data, i, end, f"{here}: the length")
            if size > end - i:
                raise ValueError(f"{here} says it has {size:,} bytes, but {end - i:,} are left "
                                 f"(a truncated record?)")
            if holds == "utf-8":
                try:
                    data[i : i + size].decode("utf-8")
                except UnicodeDecodeError:
                    raise ValueError(f"{here}: a feature name that is not UTF-8") from None
            elif holds == "floats" and size % 4:
                raise ValueError(f"{here}: {size} bytes of packed floats, not a multiple of 4")
            elif holds == "varints":
                j = i
                while j < i + size:
                    _, j = _varint(data, j, i + size, f"{here} > a value")
            elif holds:
                _walk(data, i, i + size, holds, f"{here} > ")
            i += size
        elif wire == _GROUP_END:
            raise ValueError(f"{here}: a group ends that never started")
        elif wire != _GROUP_START:  # a group (an old encoding) is left to protobuf to judge
            raise ValueError(f"{here}: wire type {wire} does not exist")
        else:
            return


def _problem(data: bytes) -> str | None:
    """What is wrong with a record protobuf refused, if the walk finds it."""
    try:
        _walk(data, 0, len(data), "Example", "")
    except ValueError as error:
        return str(error)
    return None
