"""Conversion to ArrayRecord on Apache Beam (the optional extra ``granary[beam]``).

The only room of the package that imports ``apache_beam``; ``import dataloader`` never
loads it, and these names are not re-exported by ``dataloader`` (so ``dir(dl)`` works
without Beam). Import them from here:

* :func:`convert` runs ``python -m dataloader convert``: count the inputs' records,
  plan contiguous shards (or one per file), write each shard from its input slices in
  one worker, then commit all shards at once. :func:`verify` reads them back.
* :class:`ConvertToArrayRecord` is that pipeline as a ``PTransform``.
* :class:`ReadRecordFiles` reads TFRecord, Parquet, JSON lines, CSV and NumPy files as
  ``((file index, record index), bytes)``; :class:`WriteToArrayRecord` writes any
  PCollection of records (or keyed records) as atomic, deterministic shards.

Record encodings are those of :mod:`dataloader.beam.record_files`.

Example:
    >>> from dataloader.beam import convert  # doctest: +SKIP
    >>> convert(["data/*.tfrecord"], "out/train", num_shards=4,
    ...         pipeline_args=["--direct_num_workers=2"]).paths  # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from typing import Any

# Loaded on first use (PEP 562), so ``dataloader.beam.plan``, which imports no Beam, can
# serve the single-process converter where Beam is not installed.
_EXPORTS = {
    "ConvertResult": "dataloader.beam.run",
    "ConvertToArrayRecord": "dataloader.beam.pipeline",
    "ReadRecordFiles": "dataloader.beam.pipeline",
    "ShardResult": "dataloader.beam.sink",
    "WriteToArrayRecord": "dataloader.beam.sink",
    "convert": "dataloader.beam.run",
    "pipeline_options": "dataloader.beam.run",
    "verify": "dataloader.beam.run",
}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'dataloader.beam' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = [
    "ConvertResult",
    "ConvertToArrayRecord",
    "ReadRecordFiles",
    "ShardResult",
    "WriteToArrayRecord",
    "convert",
    "pipeline_options",
    "verify",
]
