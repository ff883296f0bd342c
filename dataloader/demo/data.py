"""The demo's data: scikit-learn's 8x8 digits as ArrayRecord and Parquet, and its operations.

A record is 65 bytes: the label, then the 64 pixels (0..16) row by row. The
operations named in ``configs/demo.yaml`` and ``configs/array_record_images.yaml``
live here; they need numpy only, because worker processes import this module to run
them (and must stay light: no JAX, no scikit-learn).

Example:
    >>> record = encode_digit(np.arange(64).reshape(8, 8) % 17, 3)
    >>> example = decode_digit(record)
    >>> example["image"].shape, int(example["label"])
    ((8, 8), 3)
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from dataloader.sources import write_array_record

IMAGE_SHAPE = (8, 8)
NUM_CLASSES = 10


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """The 1,797 digits scikit-learn ships (no download): uint8 images (0..16), labels."""
    try:
        from sklearn.datasets import load_digits as sklearn_digits
    except ImportError:
        raise ImportError(
            "the demo reads scikit-learn's digits; install it with "
            "pip install -e '.[demo]' (make demo does so)"
        ) from None
    digits = sklearn_digits()
    return digits.images.astype(np.uint8), digits.target.astype(np.uint8)


def encode_digit(image: np.ndarray, label: int) -> bytes:
    return bytes([int(label)]) + np.asarray(image, dtype=np.uint8).tobytes()


def decode_digit(record: bytes) -> dict[str, Any]:
    """ArrayRecord bytes -> ``{"image": float32 (8, 8) in [0, 1], "label": int32}``."""
    data = np.frombuffer(record, dtype=np.uint8)
    return {
        "image": data[1:].reshape(IMAGE_SHAPE).astype(np.float32) / 16.0,
        "label": np.int32(data[0]),
    }


def digit_from_row(row: dict[str, Any]) -> dict[str, Any]:
    """A Parquet row ``{"pixels": 64 ints, "label": int}`` -> the decoded example."""
    return {
        "image": np.asarray(row["pixels"], dtype=np.float32).reshape(IMAGE_SHAPE) / 16.0,
        "label": np.int32(row["label"]),
    }


def jitter(example: dict[str, Any], rng: np.random.Generator, max_shift: int = 1, noise: float = 0.0) -> dict[str, Any]:
    """Shifts the image by up to ``max_shift`` pixels (blank border) and adds Gaussian noise."""
    image = example["image"]
    if max_shift:
        dy, dx = (int(v) for v in rng.integers(-max_shift, max_shift + 1, size=2))
        shifted = np.zeros_like(image)  # what moves in from the border is blank
        h, w = image.shape
        shifted[max(dy, 0) : h + min(dy, 0), max(dx, 0) : w + min(dx, 0)] = image[
            max(-dy, 0) : h + min(-dy, 0), max(-dx, 0) : w + min(-dx, 0)
        ]
        image = shifted
    if noise:
        image = image + rng.normal(0.0, noise, size=image.shape).astype(np.float32)
    return {"image": image, "label": example["label"]}


def has_ink(example: dict[str, Any], min_ink: float = 0.0) -> bool:
    """Keeps images whose mean intensity exceeds ``min_ink`` (a filter for the examples)."""
    return float(example["image"].mean()) > min_ink


def write_digits(
    directory: str | os.PathLike,
    images: np.ndarray,
    labels: np.ndarray,
    *,
    test_size: int = 297,
    num_shards: int = 4,
) -> dict[str, Any]:
    """Writes the train split as ArrayRecord shards and Parquet, the test split as numpy.

    Files: ``digits-train-0000i-of-0000n.array_record`` (group size 1),
    ``digits-train.parquet`` (columns ``pixels`` and ``label``) and ``digits-test.npz``.

    Returns:
        ``{"train": [shard paths], "parquet": path, "test": path, "num_train": int}``.
    """
    os.makedirs(directory, exist_ok=True)
    images, labels = np.asarray(images, dtype=np.uint8), np.asarray(labels, dtype=np.uint8)
    train_x, train_y = images[: len(images) - test_size], labels[: len(labels) - test_size]
    shards = []
    for shard, part in enumerate(np.array_split(np.arange(len(train_x)), num_shards)):
        path = os.path.join(directory, f"digits-train-{shard:05d}-of-{num_shards:05d}.array_record")
        write_array_record(path, (encode_digit(train_x[i], train_y[i]) for i in part))
        shards.append(path)
    parquet = os.path.join(directory, "digits-train.parquet")
    _write_parquet(parquet, train_x, train_y)
    test = os.path.join(directory, "digits-test.npz")
    np.savez(test, images=images[len(images) - test_size :], labels=labels[len(labels) - test_size :])
    return {"train": shards, "parquet": parquet, "test": test, "num_train": len(train_x)}


def _write_parquet(path: str, images: np.ndarray, labels: np.ndarray) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pixels = pa.array([row.tolist() for row in images.reshape(len(images), -1)], type=pa.list_(pa.uint8()))
    table = pa.table({"pixels": pixels, "label": pa.array(labels, type=pa.uint8())})
    pq.write_table(table, path, row_group_size=256)


def synthetic_digits(count: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Random stand-ins with the digits' shapes and ranges, for tests without scikit-learn."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 17, size=(count, *IMAGE_SHAPE), dtype=np.uint8), rng.integers(
        0, NUM_CLASSES, size=count, dtype=np.uint8
    )
