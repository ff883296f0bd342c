"""tf.train.Example records without TensorFlow, checked against protobuf's own codec.

The reference is TensorFlow's schema declared here independently (with the map that
example.proto has), so the module's own declaration (a repeated entry, to keep the
features' order) is tested against it, not against itself.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dataloader as dl
from dataloader.maxtext import encode_example, eval_dataset, parse_example, parse_maxtext_config


def _example_class():
    """tf.train.Example's messages, declared to protobuf here (as example.proto and
    feature.proto declare them), so protobuf's codec is the reference."""
    f = descriptor_pb2.FileDescriptorProto(name="granary_example.proto", package="tf", syntax="proto3")
    L, R = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL, descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
    T = descriptor_pb2.FieldDescriptorProto

    def message(name, fields, nested=()):
        m = f.message_type.add(name=name)
        for field in fields:
            m.field.add(**field)
        for n in nested:
            m.nested_type.add().CopyFrom(n)
        return m

    for name, kind in (("BytesList", T.TYPE_BYTES), ("FloatList", T.TYPE_FLOAT), ("Int64List", T.TYPE_INT64)):
        message(name, [dict(name="value", number=1, label=R, type=kind)])
        if kind != T.TYPE_BYTES:
            f.message_type[-1].field[0].options.packed = True
    feature = message("Feature", [dict(name="bytes_list", number=1, label=L, type=T.TYPE_MESSAGE, type_name=".tf.BytesList", oneof_index=0),
                                  dict(name="float_list", number=2, label=L, type=T.TYPE_MESSAGE, type_name=".tf.FloatList", oneof_index=0),
                                  dict(name="int64_list", number=3, label=L, type=T.TYPE_MESSAGE, type_name=".tf.Int64List", oneof_index=0)])
    feature.oneof_decl.add(name="kind")
    entry = descriptor_pb2.DescriptorProto(name="FeatureEntry", options=descriptor_pb2.MessageOptions(map_entry=True))
    entry.field.add(name="key", number=1, label=L, type=T.TYPE_STRING)
    entry.field.add(name="value", number=2, label=L, type=T.TYPE_MESSAGE, type_name=".tf.Feature")
    message("Features", [dict(name="feature", number=1, label=R, type=T.TYPE_MESSAGE, type_name=".tf.Features.FeatureEntry")], [entry])
    message("Example", [dict(name="features", number=1, label=L, type=T.TYPE_MESSAGE, type_name=".tf.Features")])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tf.Example"))


@pytest.fixture(scope="module")
def Example():
    return _example_class()


def _reference(Example, features):
    example = Example()
    for name, value in features.items():
        slot = example.features.feature[name]
        if isinstance(value, list):
            slot.bytes_list.value.extend(value)
        elif value.dtype.kind == "f":
            slot.float_list.value.extend(value.tolist())
        else:
            slot.int64_list.value.extend(value.tolist())
    return example


FEATURES = {"text": [b"the loader", b"packs"], "ids": np.array([0, 1, -7, 300, 2**40]),
            "scores": np.array([0.5, -1.25], np.float32), "empty": []}


def test_parse_reads_what_protobuf_writes(Example):
    parsed = parse_example(_reference(Example, FEATURES).SerializeToString())
    assert parsed["text"] == [b"the loader", b"packs"]
    assert parsed["ids"].tolist() == [0, 1, -7, 300, 2**40]
    assert parsed["scores"].tolist() == [0.5, -1.25]


def test_encode_writes_what_protobuf_reads(Example):
    decoded = Example.FromString(encode_example(FEATURES))
    assert list(decoded.features.feature["text"].bytes_list.value) == [b"the loader", b"packs"]
    assert list(decoded.features.feature["ids"].int64_list.value) == [0, 1, -7, 300, 2**40]
    assert list(decoded.features.feature["scores"].float_list.value) == [0.5, -1.25]


def _reference_values(Example, record):
    """What protobuf's codec reads from ``record`` (None if it refuses it), as parse_example shapes it."""
    try:
        example = Example.FromString(record)
    except DecodeError:
        return None
    out = {}
    for name, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        out[name] = {"bytes_list": lambda f: list(f.bytes_list.value),
                     "float_list": lambda f: np.array(f.float_list.value, np.float32).tolist(),
                     "int64_list": lambda f: np.array(f.int64_list.value, np.int64).tolist(),
                     None: lambda f: []}[kind](feature)
    return out


def _ours(record):
    """parse_example's reading of ``record`` as plain lists (None if it refuses it)."""
    try:
        parsed = parse_example(record)
    except ValueError as error:
        message = str(error)
        return None if "is not a valid tf.train.Example" in message else {"unexpected error": [message]}
    for value in parsed.values():
        assert isinstance(value, list) or value.dtype in (np.float32, np.int64)
    return {name: value if isinstance(value, list) else value.tolist() for name, value in parsed.items()}


def _same(ours, reference):
    """Equal, NaN equal to NaN (a float list may hold NaN)."""
    if ours is None or reference is None:
        return ours is reference
    if ours.keys() != reference.keys():
        return False
    for name, value in ours.items():
        other = reference[name]
        if len(value) != len(other):
            return False
        for a, b in zip(value, other, strict=True):
            both_nan = isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)
            if not both_nan and (a != b or type(a) is not type(b)):
                return False
    return True


NAMES = st.text(max_size=8)
VALUES = st.one_of(
    st.lists(st.binary(max_size=12), max_size=4),
    st.lists(st.integers(-(2**63), 2**63 - 1), max_size=6).map(lambda v: np.array(v, np.int64)),
    st.lists(st.floats(width=32), max_size=6).map(lambda v: np.array(v, np.float32)),
)
EXAMPLES = st.dictionaries(NAMES, VALUES, max_size=5)
FUZZ = settings(max_examples=300, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@FUZZ
@given(features=EXAMPLES)
def test_every_example_protobuf_writes_reads_back_with_the_same_values(Example, features):
    record = _reference(Example, features).SerializeToString()
    assert _same(_ours(record), _reference_values(Example, record))
    assert list(parse_example(encode_example(features))) == list(features)  # the order is kept


@FUZZ
@given(record=st.binary(max_size=64))
def test_random_bytes_are_accepted_exactly_when_protobuf_accepts_them(Example, record):
    assert _same(_ours(record), _reference_values(Example, record))


def _framed(number: int, payload: bytes) -> bytes:
    return bytes([number << 3 | 2, len(payload)]) + payload


@FUZZ
@given(body=st.binary(max_size=30), depth=st.integers(0, 3), kind=st.integers(1, 3), key=st.binary(max_size=3))
def test_random_bytes_inside_each_message_are_read_as_protobuf_reads_them(Example, body, depth, kind, key):
    """Random bytes as a list, a Feature, an entry or Features, framed as a record."""
    record = body
    if depth >= 1:
        record = _framed(kind, record)  # Feature { <kind>_list = body }
    if depth >= 2:
        record = _framed(1, key) + _framed(2, record)  # entry { key, value }
    if depth >= 3:
        record = _framed(1, record)  # Features { feature = entry }
    record = _framed(1, record)
    assert _same(_ours(record), _reference_values(Example, record))


# One damage to a record: (what, position as a share of the record, a byte).
DAMAGE = st.tuples(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]),
                   st.floats(0, 1, exclude_max=True), st.integers(0, 255))


def _damaged(record: bytes, damages) -> bytes:
    data = bytearray(record)
    for what, where, byte in damages:
        if not data:
            break
        i = int(where * len(data))
        if what == "flip":
            data[i] ^= 1 << (byte % 8)
        elif what == "set":
            data[i] = byte
        elif what == "insert":
            data.insert(i, byte)
        elif what == "delete":
            del data[i]
        else:
            del data[i:]
    return bytes(data)


@FUZZ
@given(features=EXAMPLES.filter(bool), damages=st.lists(DAMAGE, min_size=1, max_size=3))
def test_damaged_examples_are_refused_or_read_exactly_as_protobuf_does(Example, features, damages):
    record = _damaged(encode_example(features), damages)
    assert _same(_ours(record), _reference_values(Example, record))


def test_every_truncation_of_a_record_is_refused_not_read_as_a_shorter_one():
    record = encode_example(FEATURES)
    for cut in range(1, len(record)):
        with pytest.raises(ValueError, match=rf"\({cut} bytes?\) is not a valid tf.train.Example: "):
            parse_example(record[:cut], where="record 3 of x.array_record")


def test_the_error_names_the_record_and_the_field_that_does_not_fit():
    record = encode_example({"text": [b"hello world"]})
    with pytest.raises(ValueError, match=r"^record 3 of x.array_record \(14 bytes\) is not a valid "
                                         r"tf.train.Example: features at byte 0 says it has 25 bytes, "
                                         r"but 12 are left \(a truncated record\?\)"):
        parse_example(record[:14], where="record 3 of x.array_record")
    bad_name = encode_example({"ab": [b""]}).replace(b"ab", b"a\xff")
    with pytest.raises(ValueError, match=r"features at byte 0 > feature at byte 2 > key at byte 4: "
                                         r"a feature name that is not UTF-8"):
        parse_example(bad_name)


def test_a_400_kb_record_decodes_and_a_400_kb_number_is_refused():
    """The old decoder took 5-15 s for these (quadratic varints); protobuf's is linear.
    No time is asserted (the suite runs on busy machines): a quadratic decoder shows up as
    a test that takes minutes."""
    ids = np.arange(0, 2**62, 2**62 // 50_000, dtype=np.int64)[:50_000]  # 9-byte varints
    record = encode_example({"ids": ids})
    assert len(record) > 400_000
    assert np.array_equal(parse_example(record)["ids"], ids)
    endless = b"\x08" + b"\xff" * 400_000  # field 1, a varint that never ends
    with pytest.raises(ValueError, match=r"the number at byte 1 is longer than 10 bytes"):
        parse_example(endless)


def test_bytes_that_are_no_example_are_refused():
    with pytest.raises(ValueError, match=r"a record \(3 bytes\) is not a valid tf.train.Example: features at byte 0: wire type 7"):
        parse_example(b"\x0f\xff\xff")


def test_encode_writes_what_protobuf_writes_byte_for_byte(Example):
    for name, value in FEATURES.items():
        if len(value):  # an empty list is written as an empty float list (below)
            assert encode_example({name: value}) == _reference(Example, {name: value}).SerializeToString()
    assert parse_example(encode_example({"empty": []}))["empty"].dtype == np.float32
    assert parse_example(encode_example({"big": np.array([2**64 - 1], np.uint64)}))["big"].tolist() == [-1]


def test_encode_refuses_values_that_are_neither_text_nor_numbers():
    with pytest.raises(TypeError, match=r"feature 'when' holds datetime64\[D\] values"):
        encode_example({"when": np.array(["2024-01-01"], "datetime64[D]")})


def test_maxtexts_tf_example_records_feed_the_pipeline(Example, base_keys, text_data, tmp_path):
    path = tmp_path / "examples.array_record"
    dl.write_array_record(path, [_reference(Example, {"text": [t.encode()]}).SerializeToString()
                                 for t in text_data["held_out"]])
    config = parse_maxtext_config({**base_keys, "grain_eval_files": str(path), "record_format": "tf_example"})
    plain = parse_maxtext_config(base_keys)
    ours = [b["inputs"].tolist() for b in eval_dataset(config, global_batch_size=4)]
    assert ours == [b["inputs"].tolist() for b in eval_dataset(plain, global_batch_size=4)]
