"""Text shards and tokenizers for the MaxText pipeline tests, written per module."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dataloader as dl
from dataloader.maxtext import encode_example
from tests import tokenizer_files as tf


def _example(text):
    """A serialized tf.train.Example with the text in its ``text`` feature and an int64 feature beside it."""
    return encode_example({"text": [text.encode()], "length": [len(text)]})


@pytest.fixture(scope="module")
def text_data(tmp_path_factory):
    """Two text shards (120 lines), a JSON-record shard, a Parquet file, the same texts as
    TFRecord files of ``tf.train.Example`` records, and tokenizers."""
    folder = tmp_path_factory.mktemp("maxtext_data")
    lines = tf.corpus(160)
    train, held_out = lines[:120], lines[120:]
    for shard in range(2):
        dl.write_array_record(folder / f"train-{shard}.array_record", [t.encode() for t in train[shard::2]])
        dl.write_tfrecord(folder / f"train-{shard}.tfrecord", [_example(t) for t in train[shard::2]])
    dl.write_array_record(folder / "eval.array_record", [t.encode() for t in held_out])
    dl.write_tfrecord(folder / "eval.tfrecord", [_example(t) for t in held_out])
    dl.write_array_record(folder / "json.array_record", [json.dumps({"body": t}).encode() for t in held_out])
    pq.write_table(pa.table({"text": held_out}), folder / "eval.parquet", row_group_size=8)
    return {
        "folder": folder,
        "train": str(folder / "train-*.array_record"),
        "train_lines": train,
        "eval": str(folder / "eval.array_record"),
        "held_out": held_out,
        "huggingface": tf.huggingface_json(str(folder)),
        "sentencepiece": tf.sentencepiece_model(str(folder)),
    }


@pytest.fixture
def base_keys(text_data):
    """MaxText keys of a small pipeline (rows of 24 tokens, 4 rows per batch, in-process)."""
    return {"grain_train_files": text_data["train"], "grain_eval_files": text_data["eval"],
            "tokenizer_path": text_data["huggingface"], "tokenizer_type": "huggingface",
            "max_target_length": 24, "per_device_batch_size": 4, "grain_worker_count": 0,
            "data_shuffle_seed": 3}
