"""``inspect``: files, group sizes, and several records decoded where the format is known."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tracemalloc
import zipfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.lib import format as npy_format
from PIL import Image

import dataloader as dl
from dataloader.cli import decode
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


# Hostile records: every one is described in one line, within bounded memory, never raised.


def npy_header(shape, dtype="<f8", fortran=False) -> bytes:
    out = io.BytesIO()
    npy_format.write_array_header_1_0(out, {"descr": dtype, "fortran_order": fortran, "shape": tuple(shape)})
    return out.getvalue()


def described_with_peak(record: bytes) -> tuple[str, int]:
    """describe_record's line and the most memory Python and numpy held while it ran."""
    tracemalloc.start()
    try:
        line = describe_record(record)
        return line, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_an_npy_header_that_claims_more_than_the_record_is_not_allocated():
    record = npy_header((10**6, 10**5)) + b"x" * 65  # 193 bytes that claim 745 GiB
    line, peak = described_with_peak(record)
    assert len(record) == 193
    assert line == ("not a valid .npy (its header says shape (1000000, 100000) float64, 745.1 GiB; "
                    "the record has 65 bytes after it)")
    assert peak < 1 << 20, peak


def test_an_npy_of_python_objects_is_not_unpickled():
    buffer = io.BytesIO()
    np.save(buffer, np.array([1, None], dtype=object), allow_pickle=True)
    assert describe_record(buffer.getvalue()) == (
        "not a valid .npy (it holds Python objects (object), which would be unpickled; inspect does not load them)")


def test_a_fortran_order_npy_shows_its_values_in_c_order():
    array = np.asfortranarray(np.arange(6, dtype=np.int32).reshape(2, 3))
    assert describe_record(npy(array)) == "numpy .npy shape (2, 3) int32 [0 1 2 3 4 5]"


def test_an_npz_decompresses_within_a_budget_and_shows_larger_members_by_header(monkeypatch):
    monkeypatch.setattr(decode, "DECODE_BYTES", 1 << 20)
    buffer = io.BytesIO()
    np.savez_compressed(buffer, small=np.arange(3), big=np.zeros(2 << 20, np.float32))  # 8 MiB in 8 KiB
    line, peak = described_with_peak(buffer.getvalue())
    assert line == "numpy .npz {small: shape (3,) int64 [0 1 2]; big: shape (2097152,) float32 (8.0 MiB, values not read)}"
    assert peak < 2 << 20, peak


def test_a_damaged_npz_is_named_as_such():
    buffer = io.BytesIO()
    np.savez(buffer, a=np.arange(10))
    assert describe_record(buffer.getvalue()[:-30]) == "not a valid .npz (BadZipFile: File is not a zip file)"
    with zipfile.ZipFile(buffer := io.BytesIO(), "w") as archive:
        archive.writestr("a.npy", b"not numpy")
    assert describe_record(buffer.getvalue()).startswith("numpy .npz {a: not a valid .npy (its header does not parse")


def test_json_nested_past_the_recursion_limit_is_shown_as_such():
    assert describe_record(b"[" * 100_000 + b"]" * 100_000).startswith(
        "JSON nested too deeply to decode (past Python's recursion limit) '[[[[")


def test_a_truncated_tf_example_is_shown_as_bytes():
    record = encode_example({"text": [b"hello world"], "ids": np.array([5, 6, 7])})[:14]
    assert describe_record(record) == "bytes " + repr(record)


MAGICS = [b"", b"\x93NUMPY", b"\x93NUMPY\x01\x00", b"\x93NUMPY\x02\x00", b"\x93NUMPY\x03\x00", b"PK\x03\x04",
          b"\x89PNG\r\n\x1a\n", b"\xff\xd8", b"[", b"{\"a\": ", b"\n\x05"]
HOSTILE = settings(max_examples=300, deadline=None, derandomize=True)


@HOSTILE
@given(magic=st.sampled_from(MAGICS), rest=st.binary(max_size=200))
def test_random_bytes_after_any_known_magic_are_described_in_one_bounded_line(magic, rest):
    line, peak = described_with_peak(magic + rest)
    assert isinstance(line, str) and 0 < len(line) <= 800
    assert peak < 4 << 20, peak


@HOSTILE
@given(shape=st.lists(st.integers(0, 2**40), max_size=4),
       dtype=st.sampled_from(["<f8", "|u1", ">i4", "<c16", "|S7", "|b1", "<U3", "<m8[s]"]),
       fortran=st.booleans(), data=st.binary(max_size=64))
def test_crafted_npy_headers_are_checked_before_any_array_is_made(shape, dtype, fortran, data):
    """Any header with any data: the array's values when the data holds them, else a line
    that says what the header claims; never an allocation of the claimed size."""
    line, peak = described_with_peak(npy_header(shape, dtype, fortran) + data)
    needed = int(np.prod(shape, dtype=object)) * np.dtype(dtype).itemsize
    if needed <= len(data):
        assert line.startswith(f"numpy .npy shape {tuple(shape)} "), line
    else:
        assert line.startswith(f"not a valid .npy (its header says shape {tuple(shape)} "), line
    assert peak < 4 << 20, peak


def test_inspect_reports_every_record_even_when_records_or_decode_fail(tmp_path):
    bad_example = encode_example({"text": [b"hello world"]})[:14]
    records = [b'{"a": 1}', bad_example, npy_header((10**6, 10**5)) + b"x" * 65, b"[" * 50_000]
    dl.write_array_record(tmp_path / "bad.array_record", records)
    text = describe_array_records([str(tmp_path / "bad.array_record")], records=4, decode=json.loads)
    assert text.splitlines()[2:] == [
        'record 0 (8 bytes): JSON {"a": 1}',
        "  decoded: {a: 1}",
        f"record 1 (14 bytes): bytes {bad_example!r}",
        "  decoded: failed: JSONDecodeError: Expecting value: line 2 column 1 (char 1)",
        "record 2 (193 bytes): not a valid .npy (its header says shape (1000000, 100000) float64, 745.1 GiB; "
        "the record has 65 bytes after it)",
        "  decoded: failed: UnicodeDecodeError: 'utf-8' codec can't decode byte 0x93 in position 0: invalid start byte",
        "record 3 (50,000 bytes): JSON nested too deeply to decode (past Python's recursion limit) '"
        + "[" * 200 + "' ...",
        "  decoded: failed: RecursionError: maximum recursion depth exceeded while decoding a JSON array "
        "from a unicode string",
    ]


@pytest.mark.timeout(120)
def test_python_m_dataloader_inspect_exits_0_on_hostile_records(tmp_path):
    records = [encode_example({"text": [b"hello world"]})[:14], npy_header((10**6, 10**5)) + b"x" * 65]
    dl.write_array_record(tmp_path / "bad.array_record", records)
    done = subprocess.run([sys.executable, "-m", "dataloader", "inspect", str(tmp_path / "bad.array_record")],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": REPO_ROOT},
                          cwd=REPO_ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert "record 1 (193 bytes): not a valid .npy (its header says shape (1000000, 100000) float64" in done.stdout
