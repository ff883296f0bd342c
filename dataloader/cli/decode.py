"""What a record holds, for ``inspect``: its format, recognised from its bytes, and a
short rendering of it.

Recognised, in this order: ``.npy`` and ``.npz`` (numpy: shape and dtype), PNG and JPEG
(the shape and dtype the image decodes to, read from the file's header, with no image
library), JSON, UTF-8 text, and serialized ``tf.train.Example`` protocol buffers
(decoded without TensorFlow by :mod:`dataloader.maxtext.records`). Anything else is
shown as bytes.

Example:
    >>> describe_record(b'{"x": 1}')
    'JSON {"x": 1}'
    >>> describe_record(bytes.fromhex("89504e470d0a1a0a0000000d49484452000000200000001008060000001f"))
    'PNG image: shape (16, 32, 4) uint8 (RGBA)'
"""

from __future__ import annotations

import io
import json
import struct
from typing import Any

import numpy as np

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


def _array(value: np.ndarray) -> str:
    flat = value.reshape(-1)
    head = np.array2string(flat[:8], threshold=8, max_line_width=200)
    more = " ..." if flat.size > 8 else ""
    return f"shape {value.shape} {value.dtype} {head}{more}"


def _example(record: bytes) -> str | None:
    """A ``tf.train.Example``'s features, or None if the bytes are not one."""
    from dataloader.maxtext.records import parse_example

    try:
        features = parse_example(record)
    except (ValueError, UnicodeDecodeError, IndexError):
        return None
    if not features or not all(name and name.isprintable() for name in features):
        return None
    parts = []
    for name, value in features.items():
        if isinstance(value, list):
            texts = [v[:40].decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in value[:2]]
            parts.append(f"{name}: {len(value)} bytes value(s) {texts}")
        else:
            parts.append(f"{name}: {value.dtype} {value.shape} {value[:6].tolist()}")
    return "tf.train.Example {" + "; ".join(parts) + "}"


def describe_record(record: bytes, limit: int = 200) -> str:
    """One line saying what ``record`` is (see the module docstring)."""
    record = bytes(record)
    if record.startswith(b"\x93NUMPY"):
        try:
            return "numpy .npy " + _array(np.load(io.BytesIO(record), allow_pickle=False))
        except ValueError:
            pass
    if record.startswith(b"PK\x03\x04"):
        try:
            with np.load(io.BytesIO(record), allow_pickle=False) as npz:
                return "numpy .npz {" + "; ".join(f"{k}: {_array(npz[k])}" for k in npz.files) + "}"
        except (ValueError, OSError):
            pass
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
        try:
            return "JSON " + json.dumps(json.loads(text))[:limit]
        except ValueError:
            return "text " + repr(text[:limit]) + (" ..." if len(text) > limit else "")
    example = _example(record)
    if example is not None:
        return example[:limit * 2]
    return "bytes " + repr(record[:limit]) + (" ..." if len(record) > limit else "")


def describe_value(value: Any) -> str:
    """What a ``--decode`` function returned: arrays as shape and dtype, dicts by key."""
    if isinstance(value, dict):
        return "{" + "; ".join(f"{k}: {describe_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)) and value and not isinstance(value[0], (int, float)):
        return "[" + ", ".join(describe_value(v) for v in value[:4]) + (", ..." if len(value) > 4 else "") + "]"
    if isinstance(value, np.ndarray):
        return _array(value)
    if isinstance(value, np.generic):
        return f"{value.dtype} {value.item()!r}"
    return repr(value)[:200]
