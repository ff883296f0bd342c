"""``tf.train.Example``'s protocol buffer messages, declared to ``protobuf`` in code.

TensorFlow declares them in ``example.proto`` and ``feature.proto``; their field
numbers and types are the wire contract, so they are restated here and handed to
protobuf as a ``FileDescriptorProto`` at import time (no ``protoc``, no generated
module, no TensorFlow)::

    message BytesList { repeated bytes value = 1; }
    message FloatList { repeated float value = 1; }     // packed (proto3's default)
    message Int64List { repeated int64 value = 1; }     // packed (proto3's default)
    message Feature {
      oneof kind { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3; }
    }
    message Features { repeated FeatureEntry feature = 1; }
    message FeatureEntry { string key = 1; Feature value = 2; }
    message Example { Features features = 1; }

One deliberate difference: TensorFlow's ``Features.feature`` is a
``map<string, Feature>``. A map is, on the wire, exactly a repeated message of
``key = 1, value = 2`` (the protobuf language guide defines it so), and is parsed the
same way (a key's string is checked to be UTF-8 in both), but protobuf's Python maps
iterate in hash order. Declared as the repeated entry it is, the features come back
in the record's order (what ``inspect`` shows, and what the hand-written decoder this
replaces gave), and the reader applies a map's two other rules itself: a repeated key
keeps its last value, and an entry holding fields other than key and value is not an
entry (protobuf moves such an entry to the map's unknown fields; see
:func:`has_unknown_fields`).

The messages live in a pool of their own, not protobuf's default pool, so they never
clash with TensorFlow's (``tensorflow.Example``) when both are imported.

Example:
    >>> example = Example()
    >>> entry = example.features.feature.add(key="ids")
    >>> entry.value.int64_list.value.extend([1, 2])
    >>> Example.FromString(example.SerializeToString()).features.feature[0].key
    'ids'
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_PACKAGE = "tensorflow"
_F = descriptor_pb2.FieldDescriptorProto

# (message, [(field, number, label, type, message type of the field or "")]); the oneof
# of Feature is added below. Every field is in TensorFlow's example.proto/feature.proto.
_SCHEMA: list[tuple[str, list[tuple[str, int, int, int, str]]]] = [
    ("BytesList", [("value", 1, _F.LABEL_REPEATED, _F.TYPE_BYTES, "")]),
    ("FloatList", [("value", 1, _F.LABEL_REPEATED, _F.TYPE_FLOAT, "")]),
    ("Int64List", [("value", 1, _F.LABEL_REPEATED, _F.TYPE_INT64, "")]),
    ("Feature", [
        ("bytes_list", 1, _F.LABEL_OPTIONAL, _F.TYPE_MESSAGE, "BytesList"),
        ("float_list", 2, _F.LABEL_OPTIONAL, _F.TYPE_MESSAGE, "FloatList"),
        ("int64_list", 3, _F.LABEL_OPTIONAL, _F.TYPE_MESSAGE, "Int64List"),
    ]),
    ("FeatureEntry", [
        ("key", 1, _F.LABEL_OPTIONAL, _F.TYPE_STRING, ""),
        ("value", 2, _F.LABEL_OPTIONAL, _F.TYPE_MESSAGE, "Feature"),
    ]),
    ("Features", [("feature", 1, _F.LABEL_REPEATED, _F.TYPE_MESSAGE, "FeatureEntry")]),
    ("Example", [("features", 1, _F.LABEL_OPTIONAL, _F.TYPE_MESSAGE, "Features")]),
]


def _file() -> descriptor_pb2.FileDescriptorProto:
    """The schema above as protobuf's descriptor of a ``.proto`` file."""
    proto = descriptor_pb2.FileDescriptorProto(
        name="granary/tf_example.proto", package=_PACKAGE, syntax="proto3"
    )
    for name, fields in _SCHEMA:
        message = proto.message_type.add(name=name)
        for field, number, label, kind, type_name in fields:
            message.field.add(
                name=field, number=number, label=label, type=kind,
                type_name=f".{_PACKAGE}.{type_name}" if type_name else None,
            )
        if name == "Feature":  # the three lists are one oneof, as in feature.proto
            message.oneof_decl.add(name="kind")
            for field_proto in message.field:
                field_proto.oneof_index = 0
    return proto


def _classes() -> dict[str, Any]:
    pool = descriptor_pool.DescriptorPool()
    pool.Add(_file())
    # GetMessageClass replaced MessageFactory.GetPrototype during protobuf 4.x.
    make = getattr(message_factory, "GetMessageClass", None) or message_factory.MessageFactory(pool).GetPrototype
    return {name: make(pool.FindMessageTypeByName(f"{_PACKAGE}.{name}")) for name, _ in _SCHEMA}


def has_unknown_fields(message: Any) -> bool:
    """Whether ``message`` itself (not its sub-messages) holds fields the schema lacks."""
    return len(_unknown_fields(message)) > 0


try:  # the module-level API; Message.UnknownFields() before it, removed since
    from google.protobuf.unknown_fields import UnknownFieldSet as _unknown_fields
except ImportError:  # pragma: no cover - protobuf < 4.22
    def _unknown_fields(message: Any) -> Any:
        return message.UnknownFields()


_CLASSES = _classes()
BytesList: Any = _CLASSES["BytesList"]
FloatList: Any = _CLASSES["FloatList"]
Int64List: Any = _CLASSES["Int64List"]
Feature: Any = _CLASSES["Feature"]
FeatureEntry: Any = _CLASSES["FeatureEntry"]
Features: Any = _CLASSES["Features"]
Example: Any = _CLASSES["Example"]
