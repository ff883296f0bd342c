"""tf.train.Example records without TensorFlow, checked against protobuf's own codec."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

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


def test_bytes_that_are_no_example_are_refused():
    with pytest.raises(ValueError, match=r"a record \(3 bytes\) is not a valid tf.train.Example: features at byte 0: wire type 7"):
        parse_example(b"\x0f\xff\xff")


def test_maxtexts_tf_example_records_feed_the_pipeline(Example, base_keys, text_data, tmp_path):
    path = tmp_path / "examples.array_record"
    dl.write_array_record(path, [_reference(Example, {"text": [t.encode()]}).SerializeToString()
                                 for t in text_data["held_out"]])
    config = parse_maxtext_config({**base_keys, "grain_eval_files": str(path), "record_format": "tf_example"})
    plain = parse_maxtext_config(base_keys)
    ours = [b["inputs"].tolist() for b in eval_dataset(config, global_batch_size=4)]
    assert ours == [b["inputs"].tolist() for b in eval_dataset(plain, global_batch_size=4)]
