"""What a record holds, for ``inspect``: its format, recognised from its bytes, and a
short rendering of it.

Recognised, in this order: ``.npy`` and ``.npz`` (numpy: shape and dtype), PNG and JPEG
(the shape and dtype the image decodes to, read from the file's header, with no image
library), JSON, UTF-8 text, and serialized ``tf.train.Example`` protocol buffers
(decoded without TensorFlow by :mod:`dataloader.maxtext.records`). Anything else is
shown as bytes.

A record is data someone else wrote, so describing it is bounded and never raises: a
``.npy`` header is checked against the bytes that follow it before any array is made
(a 193-byte record whose header claims 745 GiB is reported as such), an ``.npz``
decompresses at most ``DECODE_BYTES`` in all (larger members are shown by their
header), pickled objects are never loaded, JSON is parsed only up to ``PARSE_BYTES``
and within Python's recursion limit, and a record no decoder makes sense of is shown as
``not a valid <format> (why)`` or as bytes.

Example:
    >>> describe_record(b'{"x": 1}')
    'JSON {"x": 1}'
    >>> describe_record(bytes.fromhex("89504e470d0a1a0a0000000d49484452000000200000001008060000001f"))
    'PNG image: shape (16, 32, 4) uint8 (RGBA)'
    >>> header = io.BytesIO()
    >>> npy_format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False, "shape": (10**6, 10**5)})
    >>> describe_record(header.getvalue())
    'not a valid .npy (its header says shape (1000000, 100000) float64, 745.1 GiB; the record has 0 bytes after it)'
"""

from __future__ import annotations

import io
import json
import math
import struct
import zipfile
from typing import Any

import numpy as np
from numpy.lib import format as npy_format

# The most an .npz member decompresses to, in all, for one record; past it, members are
# shown by their header alone. (A 1.4 MB .npz of zeros holds 1.4 GB of arrays.)
DECODE_BYTES = 64 << 20
# The largest text parsed as JSON (Python's objects take ~10x the text).
PARSE_BYTES = 16 << 20
# Members of an .npz and features of an Example shown, at most.
SHOWN = 16

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# PNG colour type -> (channels, name); a palette decodes to RGB.
PNG_COLORS = {0: (1, "grey"), 2: (3, "RGB"), 3: (3, "palette"), 4: (2, "grey + alpha"), 6: (4, "RGBA")}
# JPEG start-of-frame markers (every 0xFFCn but DHT C4, JPG C8 and DAC CC).
JPEG_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def png_shape(data: bytes) -> tuple[tuple[int, ...], str, str] | None:
    """(shape, dtype, colour) a PNG decodes to, from its IHDR chunk; None if not a PNG."""
    if not data.startswith(PNG_SIGNATURE) or data[12:16] != b"IHDR" or len(data) < 26:
        return None
    width, height, depth, color = struct.unpack(">IIBB", data[16:26])
    channels, name = PNG_COLORS.get(color, (1, f"colour type {color}"))
    shape = (height, width) if channels == 1 else (height, width, channels)
    return shape, "uint16" if depth == 16 else "uint8", name


def jpeg_shape(data: bytes) -> tuple[tuple[int, ...], str, str] | None:
    """(shape, dtype, colour) a JPEG decodes to, from its start-of-frame segment."""
    if not data.startswith(b"\xff\xd8"):
        return None
    i = 2
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # segments without a length
            i += 2
            continue
        (length,) = struct.unpack(">H", data[i + 2 : i + 4])
        if marker in JPEG_SOF and i + 10 <= len(data):
            precision, height, width, components = struct.unpack(">BHHB", data[i + 4 : i + 10])
            name = {1: "grey", 3: "YCbCr/RGB", 4: "CMYK"}.get(components, f"{components} components")
            shape = (height, width) if components == 1 else (height, width, components)
            return shape, "uint16" if precision > 8 else "uint8", name
        i += 2 + length
    return None


class _Invalid(ValueError):
    """A record that starts like a format but is not valid in it: shown, not raised."""


def _size(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:,} bytes" if unit == "bytes" else f"{n:,.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    raise AssertionError("unreachable")


def _array(value: np.ndarray) -> str:
    head = np.array2string(np.asarray(value.flat[:8]), threshold=8, max_line_width=200)
    more = " ..." if value.size > 8 else ""
    return f"shape {value.shape} {value.dtype} {head}{more}"


def _npy_header(stream: Any) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """(shape, Fortran order, dtype, data bytes) from an .npy header, checked."""
    try:
        version = npy_format.read_magic(stream)
        if version == (1, 0):
            shape, fortran, dtype = npy_format.read_array_header_1_0(stream)
        elif version == (2, 0):
            shape, fortran, dtype = npy_format.read_array_header_2_0(stream)
        else:
            raise _Invalid(f"format version {version[0]}.{version[1]}, which inspect does not read")
    except _Invalid:
        raise
    except Exception as error:  # numpy's ValueError, or a header it cannot evaluate
        raise _Invalid(f"its header does not parse: {error}") from None
    if any(d < 0 for d in shape):
        raise _Invalid(f"its header says shape {shape}")
    if dtype.hasobject:
        raise _Invalid(f"it holds Python objects ({dtype}), which would be unpickled; inspect does not load them")
    return shape, fortran, dtype, math.prod(shape) * dtype.itemsize


def _npy(data: bytes) -> str:
    """An .npy record's array, made only once its header fits the bytes after it."""
    stream = io.BytesIO(data)
    shape, fortran, dtype, nbytes = _npy_header(stream)
    left = len(data) - stream.tell()
    if nbytes > left:
        raise _Invalid(f"its header says shape {shape} {dtype}, {_size(nbytes)}; the record has "
                       f"{_size(left)} after it")
    if dtype.itemsize == 0:
        return f"shape {shape} {dtype}"
    flat = np.frombuffer(data, dtype=dtype, count=nbytes // dtype.itemsize, offset=stream.tell())
    return _array(flat.reshape(shape, order="F" if fortran else "C"))


def _npz(data: bytes) -> str:
    """An .npz record's arrays; members past the ``DECODE_BYTES`` budget by header only."""
    budget, parts = DECODE_BYTES, []
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        members = archive.infolist()
        for info in members[:SHOWN]:
            name = info.filename.removesuffix(".npy")
            if info.file_size <= budget:  # the decompressor stops at the declared size
                budget -= info.file_size
                try:
                    parts.append(f"{name}: {_npy(archive.read(info))}")
                except _Invalid as error:
                    parts.append(f"{name}: not a valid .npy ({error})")
                continue
            with archive.open(info) as member:
                shape, _, dtype, nbytes = _npy_header(member)
            parts.append(f"{name}: shape {shape} {dtype} ({_size(nbytes)}, values not read)")
        if len(members) > SHOWN:
            parts.append(f"... {len(members) - SHOWN} more")
    return "{" + "; ".join(parts) + "}"


def _example(record: bytes, limit: int) -> str | None:
    """A ``tf.train.Example``'s features, or None if the bytes are not one."""
    from dataloader.maxtext.records import parse_example

    try:
        features = parse_example(record)
    except ValueError:
        return None
    if not features or not all(name and name.isprintable() for name in features):
        return None
    parts: list[str] = []
    for name, value in list(features.items())[:SHOWN]:
        if isinstance(value, list):
            texts = [v[:40].decode("utf-8", "replace") for v in value[:2]]
            parts.append(f"{name}: {len(value)} bytes value(s) {texts}")
        else:
            parts.append(f"{name}: {value.dtype} {value.shape} {value[:6].tolist()}")
    if len(features) > SHOWN:
        parts.append(f"... {len(features) - SHOWN} more")
    return ("tf.train.Example {" + "; ".join(parts) + "}")[: limit * 2]


def _text(text: str, limit: int) -> str:
    preview = repr(text[:limit]) + (" ..." if len(text) > limit else "")
    if len(text) > PARSE_BYTES:
        return f"text ({_size(len(text))}, not parsed as JSON) {preview}"
    try:
        return "JSON " + json.dumps(json.loads(text))[:limit]
    except RecursionError:
        return f"JSON nested too deeply to decode (past Python's recursion limit) {preview}"
    except ValueError:
        return "text " + preview


def describe_record(record: bytes, limit: int = 200) -> str:
    """One line saying what ``record`` is (see the module docstring); never raises."""
    try:
        return _describe(bytes(record), limit)
    except Exception as error:  # a record is data: a failure is part of the report
        return f"not described ({type(error).__name__}: {error})"[: limit * 2]


def _describe(record: bytes, limit: int) -> str:
    for magic, kind, decode in ((b"\x93NUMPY", "npy", _npy), (b"PK\x03\x04", "npz", _npz)):
        if record.startswith(magic):
            try:
                return f"numpy .{kind} {decode(record)}"
            except _Invalid as error:
                return f"not a valid .{kind} ({error})"[: limit * 2]
            except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, NotImplementedError,
                    RuntimeError, ValueError) as error:  # what zipfile and zlib raise
                return f"not a valid .{kind} ({type(error).__name__}: {error})"[: limit * 2]
    for kind, parse in (("PNG", png_shape), ("JPEG", jpeg_shape)):
        found = parse(record)
        if found is not None:
            shape, dtype, color = found
            return f"{kind} image: shape {shape} {dtype} ({color})"
    try:
        text = record.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and (text.isprintable() or text.replace("\n", "").replace("\t", "").isprintable()):
        return _text(text, limit)
    example = _example(record, limit)
    if example is not None:
        return example
    return "bytes " + repr(record[:limit]) + (" ..." if len(record) > limit else "")


def describe_value(value: Any) -> str:
    """What a ``--decode`` function returned: arrays as shape and dtype, dicts by key."""
    if isinstance(value, dict):
        shown = [f"{k}: {describe_value(v)}" for k, v in list(value.items())[:SHOWN]]
        return "{" + "; ".join(shown) + (f"; ... {len(value) - SHOWN} more" if len(value) > SHOWN else "") + "}"
    if isinstance(value, (list, tuple)) and value and not isinstance(value[0], (int, float)):
        return "[" + ", ".join(describe_value(v) for v in value[:4]) + (", ..." if len(value) > 4 else "") + "]"
    if isinstance(value, np.ndarray):
        return _array(value)
    if isinstance(value, np.generic):
        return f"{value.dtype} {value.item()!r}"
    return repr(value)[:200]
