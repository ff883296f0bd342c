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

Record encodings are those of :mod:`dataloader.sources.record_files`.

Example:
    >>> from dataloader.beam import convert  # doctest: +SKIP
    >>> convert(["data/*.tfrecord"], "out/train", num_shards=4,
    ...         pipeline_args=["--direct_num_workers=2"]).paths  # doctest: +SKIP
"""

from __future__ import annotations

from dataloader.beam.pipeline import ConvertToArrayRecord, ReadRecordFiles
from dataloader.beam.run import ConvertResult, convert, pipeline_options, verify
from dataloader.beam.sink import ShardResult, WriteToArrayRecord

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
