"""Record decoders shared by every framework in the benchmark.

They live in their own small module, importing only numpy and Pillow, so that
worker processes started with ``spawn`` import them by name and stay light.
Every decoder maps the raw record bytes to a numpy array of a fixed shape per
data set, so the default batching of each framework (``np.stack`` or torch's
collate) applies unchanged.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable

import numpy as np


def decode_none(record: bytes) -> np.ndarray:
    """Returns the record as a uint8 vector (a view: no copy until batching)."""
    return np.frombuffer(record, dtype=np.uint8)


def decode_image(record: bytes) -> np.ndarray:
    """Decodes a PNG or JPEG record to an HxW or HxWxC uint8 array."""
    from PIL import Image  # deferred: only image benchmarks pay for Pillow

    with Image.open(io.BytesIO(record)) as image:
        return np.asarray(image)


# The per-record wait of the latency-bound decoder: about what a ~1 KiB PNG costs.
WAIT_S = 100e-6


def decode_wait(record: bytes) -> np.ndarray:
    """Returns the record as ``decode_none`` does, after sleeping ``WAIT_S``.

    Latency-bound work that uses no CPU: with it, 14 workers fit a 2-core machine, so
    a pool's dispatch, ordering, buffering and start-up are measured at worker counts
    the cores could not show with real decoding (CPU contention is left out: it costs
    every row the same).
    """
    time.sleep(WAIT_S)
    return np.frombuffer(record, dtype=np.uint8)


# PNG and JPEG decode the same way; the names stay apart so a row says what it ran.
decode_png = decode_image
decode_jpeg = decode_image

DECODERS: dict[str, Callable[[bytes], np.ndarray]] = {
    "none": decode_none,
    "png": decode_png,
    "jpeg": decode_jpeg,
    "wait": decode_wait,
}


def get(name: str) -> Callable[[bytes], np.ndarray]:
    """Returns the decoder called ``name``: one of ``none``, ``png``, ``jpeg``, ``wait``."""
    try:
        return DECODERS[name]
    except KeyError:
        raise ValueError(f"unknown decoder {name!r}; choose one of {sorted(DECODERS)}") from None
