"""``inspect``: files, group sizes, and several records decoded where the format is known."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

import dataloader as dl
from dataloader.cli.decode import describe_record, jpeg_shape, png_shape
from dataloader.cli.inspect_records import describe_array_records
from dataloader.demo.data import encode_digit
from dataloader.maxtext.records import encode_example
from tests.helpers import REPO_ROOT


def image_bytes(array, fmt):
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format=fmt)
    return buffer.getvalue()


def npy(array):
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def test_inspect_shows_files_group_sizes_and_several_records(tmp_path):
    for shard in range(2):
        dl.write_array_record(tmp_path / f"d-{shard}.array_record", [b'{"x": %d}' % i for i in range(3)],
                              group_size=1 + 3 * shard)
    text = describe_array_records([str(tmp_path / "d-*.array_record")], index=2, records=3)
    lines = text.splitlines()
    assert lines[0] == "2 file(s), 6 records"
    assert "3 records  group size 1 " in lines[1] and "decodes a whole group" not in lines[1]
    assert "3 records  group size 4 " in lines[2] and "(random access decodes a whole group per record)" in lines[2]
    assert lines[3:] == ['record 2 (8 bytes): JSON {"x": 2}', 'record 3 (8 bytes): JSON {"x": 0}',
                         'record 4 (8 bytes): JSON {"x": 1}']


def test_inspect_stops_at_the_last_record_and_refuses_an_index_out_of_range(tmp_path):
    dl.write_array_record(tmp_path / "d.array_record", [b"a", b"b"])
    assert describe_array_records([str(tmp_path / "d.array_record")], index=-1, records=5).splitlines()[-1] == \
        "record 1 (1 bytes): text 'b'"
    with pytest.raises(IndexError, match="record index 2 is out of range for 2 records"):
        describe_array_records([str(tmp_path / "d.array_record")], index=2)


@pytest.mark.parametrize(("array", "fmt", "expected"), [
    (np.zeros((5, 7, 3), np.uint8), "PNG", "PNG image: shape (5, 7, 3) uint8 (RGB)"),
    (np.zeros((5, 7), np.uint8), "PNG", "PNG image: shape (5, 7) uint8 (grey)"),
    (np.zeros((6, 4, 4), np.uint8), "PNG", "PNG image: shape (6, 4, 4) uint8 (RGBA)"),
    (np.zeros((9, 11, 3), np.uint8), "JPEG", "JPEG image: shape (9, 11, 3) uint8 (YCbCr/RGB)"),
    (np.zeros((9, 11), np.uint8), "JPEG", "JPEG image: shape (9, 11) uint8 (grey)"),
])
def test_images_are_shown_as_the_shape_and_dtype_they_decode_to(array, fmt, expected):
    record = image_bytes(array, fmt)
    assert describe_record(record) == expected
    decoded = np.asarray(Image.open(io.BytesIO(record)))  # what a decoder would give
    assert f"shape {decoded.shape} {decoded.dtype}" in expected


def test_a_progressive_jpeg_and_a_16_bit_png_are_read_from_their_headers():
    buffer = io.BytesIO()
    Image.fromarray(np.zeros((8, 16, 3), np.uint8)).save(buffer, format="JPEG", progressive=True)
    assert jpeg_shape(buffer.getvalue()) == ((8, 16, 3), "uint8", "YCbCr/RGB")
    buffer = io.BytesIO()
    Image.fromarray(np.zeros((3, 2), np.uint16)).save(buffer, format="PNG")
    assert png_shape(buffer.getvalue()) == ((3, 2), "uint16", "grey")
    assert png_shape(b"\x89PNG\r\n\x1a\n") is None and jpeg_shape(b"\xff\xd8\xff") is None


def test_numpy_records_show_shape_dtype_and_values():
    assert describe_record(npy(np.arange(6, dtype=np.int16).reshape(2, 3))) == \
        "numpy .npy shape (2, 3) int16 [0 1 2 3 4 5]"
    buffer = io.BytesIO()
    np.savez(buffer, image=np.ones((2, 2), np.float32), label=np.int64(3))
    assert describe_record(buffer.getvalue()) == \
        "numpy .npz {image: shape (2, 2) float32 [1. 1. 1. 1.]; label: shape () int64 [3]}"


def test_a_tf_train_example_is_decoded_without_tensorflow():
    record = encode_example({"text": [b"hello world"], "ids": np.array([5, 6, 7]), "score": np.array([0.5])})
    assert describe_record(record) == (
        "tf.train.Example {text: 1 bytes value(s) ['hello world']; ids: int64 (3,) [5, 6, 7]; "
        "score: float32 (1,) [0.5]}"
    )


def test_text_json_and_other_bytes():
    assert describe_record(b"line one\nline two") == "text 'line one\\nline two'"
    assert describe_record(b'[1, 2]') == "JSON [1, 2]"
    digit = encode_digit(np.arange(64).reshape(8, 8) % 17, 3)
    assert describe_record(digit).startswith("bytes b'\\x03\\x00\\x01")


def test_decode_shows_what_the_pipelines_own_function_makes(tmp_path):
    dl.write_array_record(tmp_path / "digits.array_record", [encode_digit(np.full((8, 8), 16), i) for i in range(4)])
    from dataloader.demo.data import decode_digit

    text = describe_array_records([str(tmp_path / "digits.array_record")], records=2, decode=decode_digit)
    decoded = [line for line in text.splitlines() if line.startswith("  decoded:")]
    assert decoded == [f"  decoded: {{image: shape (8, 8) float32 [1. 1. 1. 1. 1. 1. 1. 1.] ...; label: int32 {i}}}"
                       for i in range(2)]


@pytest.mark.timeout(120)
def test_python_m_dataloader_inspect_takes_records_and_decode_flags(tmp_path):
    dl.write_array_record(tmp_path / "a.array_record", [encode_digit(np.full((8, 8), i), i) for i in range(5)])
    env = {**os.environ, "PYTHONPATH": REPO_ROOT}
    command = [sys.executable, "-m", "dataloader", "inspect", str(tmp_path / "a.array_record"), "--records=4", "--index=1"]
    done = subprocess.run([*command, "--decode=dataloader.demo.data.decode_digit"],
                          capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    records = [line for line in done.stdout.splitlines() if line.startswith("record ")]
    assert [r.split(":")[0] for r in records] == [f"record {i} (65 bytes)" for i in range(1, 5)]
    assert done.stdout.count("  decoded: {image: shape (8, 8) float32") == 4
    bad = subprocess.run([*command, "--decode=dataloader.demo.data.decod"],
                         capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=120)
    assert bad.returncode == 2
    assert bad.stderr.startswith("inspect: cannot import 'dataloader.demo.data.decod'")
