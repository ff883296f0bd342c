"""MaxText's pre-training input pipeline on granary: records -> tokens -> rows -> batches.

For the training stream, as MaxText's Grain pipeline does it (and the same for eval,
with the differences noted)::

    records   ArrayRecord files (one pattern, or a weighted mixture) or Parquet rows,
              globally shuffled with data_shuffle_seed, num_epoch passes
    text      each record's text (UTF-8, a JSON object's or a tf.train.Example's column;
              a Parquet row's column)
    tokens    Tokenize (tokenizer_path, add_bos, add_eos, trimmed under use_truncation)
    shard     this host's share: ShardByJaxProcess, interleaved after the global shuffle
    rows      packed (first_fit | best_fit | concat_then_split) into max_target_length,
              or one sequence per row, padded (packing: false)
    batches   per_device_batch_size * devices / processes rows per host; for training
              full batches only, for eval the last one padded with a ``mask`` (nothing
              dropped: batch_and_pad_with_mask)
    layout    MaxText's six arrays (:mod:`.format`)

The records, text and tokens steps run in ``grain_worker_count`` worker processes; the
packer and what follows run in this process on the ordered stream, so the batches do
not depend on the number of workers, and a state (a few hundred bytes) resumes exactly.
Global arrays across hosts come from the device feed: :func:`train_iterator` puts the
stream behind ``dl.device_prefetch`` with a sharding of the batch axis over a mesh.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import numpy as np

from dataloader.dataset.base import IterDataset
from dataloader.dataset.compile.mixing import parse_mixture_spec
from dataloader.dataset.map_dataset import MapDataset
from dataloader.dataset.transformations.packing import (
    BestFitPackIterDataset,
    ConcatThenSplitIterDataset,
    FirstFitPackIterDataset,
)
from dataloader.maxtext.config import MaxTextConfig
from dataloader.maxtext.format import MaxTextFormat, PadToLength
from dataloader.maxtext.records import parse_example
from dataloader.operations import MapTransform, Tokenize
from dataloader.operations.packing import BOSHandling
from dataloader.operations.padding import batch_and_pad_with_mask
from dataloader.options import MultiprocessingOptions
from dataloader.samplers import ShardByJaxProcess, ShardOptions


def mixture_parts(spec: str) -> list[tuple[str, float]]:
    """``grain_train_files`` as (pattern, weight) parts: one pattern (weight 1), or
    MaxText's ``"a*,0.3;b*,0.7"`` (``:`` also separates a weight, as in ``mix_from_spec``)."""
    if ";" not in spec:
        return [(spec, 1.0)]
    parts = []
    for part in spec.split(";"):
        pattern, comma, weight = part.strip().rpartition(",")
        parts.append(f"{pattern}:{weight}" if comma and pattern else part.strip())
    return parse_mixture_spec(";".join(parts))


class TextOf(MapTransform):
    """A record -> the text to tokenize: UTF-8 bytes as they are, a JSON object's column,
    a ``tf.train.Example``'s column (its first value, as MaxText reads it), or a row
    dict's column (Parquet)."""

    def __init__(self, record_format: str, column: str) -> None:
        super().__init__()
        self.record_format, self.column = record_format, column

    def map(self, record: Any) -> Any:
        if isinstance(record, dict):
            row = record
        elif self.record_format == "json":
            row = json.loads(record)
        elif self.record_format == "tf_example":
            row = parse_example(record)
        else:
            return record
        if self.column not in row:
            raise KeyError(f"the record has no column {self.column!r} (it has {sorted(row)}); "
                           f"set train_data_columns / eval_data_columns")
        value = row[self.column]
        if self.record_format == "tf_example" and isinstance(value, list):
            if not value:
                raise ValueError(f"the record's feature {self.column!r} holds no value")
            return value[0]
        return value

    @property
    def name(self) -> str:
        return f"TextOf({self.record_format}, {self.column!r})"


def _token_ids(value: Any) -> dict[str, np.ndarray]:
    """Pre-tokenized data (tokenize_*_data: false): the column holds the ids."""
    return {"tokens": np.asarray(value, dtype=np.int32).reshape(-1)}


def tokenizer(config: MaxTextConfig, *, check: bool = True) -> Tokenize:
    """The tokenizing operation of ``config`` (loaded here too, to check it, unless not ``check``)."""
    return Tokenize(config.tokenizer_path, kind=config.tokenizer_type, add_bos=config.add_bos,
                    add_eos=config.add_eos, output_key="tokens",
                    max_length=config.max_target_length if config.use_truncation else None, check=check)


def _records(config: MaxTextConfig, files: str, *, shuffle: bool, num_epochs: int | None) -> MapDataset:
    from dataloader.sources import ArrayRecordDataSource, ParquetDataSource

    parts = mixture_parts(files)
    if config.file_type == "parquet" and len(parts) > 1:
        raise ValueError(f"a mixture of files ({files!r}) works with grain_file_type: arrayrecord only, "
                         f"as in MaxText")
    components = []
    for c, (pattern, _) in enumerate(parts):
        source = (ParquetDataSource(pattern) if config.file_type == "parquet"
                  else ArrayRecordDataSource(pattern))
        ds = MapDataset.source(source)
        if shuffle:
            ds = ds.shuffle(seed=config.seed + c)
        if num_epochs != 1:
            ds = ds.repeat(num_epochs)
        components.append(ds)
    if len(components) == 1:
        return components[0]
    return MapDataset.mix(components, [w for _, w in parts])


def _pipeline(config: MaxTextConfig, *, files: str, column: str, tokenize: bool, shuffle: bool,
              num_epochs: int | None, batch_size: int, pad_last: bool, shard_options: ShardOptions,
              workers: int | str, buffer_size: int, tok: Tokenize | None) -> IterDataset:
    ds = _records(config, files, shuffle=shuffle, num_epochs=num_epochs)
    ds = ds.map(TextOf(config.record_format, column))
    if tokenize:
        assert tok is not None
        ds = ds.map(tok)
    else:
        ds = ds.map(_token_ids)
    stream = ds.to_iter_dataset(shard_options=shard_options)
    length = config.max_target_length
    rows: IterDataset
    if not config.packing:
        rows = stream.map(PadToLength(length))
    elif config.packing_type == "concat_then_split":
        bos = {} if not (tok is not None and config.add_bos) else {
            "bos_handling": BOSHandling.REPLACE_FIRST_TOKEN_WITH_BOS, "bos_features": ["tokens"],
            "bos_token_id": tok.bos_id}
        rows = ConcatThenSplitIterDataset(stream, length_struct={"tokens": length}, **bos)
    else:
        packer = FirstFitPackIterDataset if config.packing_type == "first_fit" else BestFitPackIterDataset
        rows = packer(stream, length_struct={"tokens": length}, num_packing_bins=batch_size,
                      seed=config.seed, max_sequences_per_bin=config.max_segments_per_seq)
    if pad_last:
        batched = rows.batch(batch_size, batch_fn=functools.partial(batch_and_pad_with_mask, batch_size=batch_size))
    else:
        batched = rows.batch(batch_size, drop_remainder=True)
    out = batched.map(MaxTextFormat(pad_id=0))
    return out.mp_prefetch(MultiprocessingOptions(num_workers=workers, per_worker_buffer_size=buffer_size))


def _hosts(batch_size: int | None, eval: bool, config: MaxTextConfig) -> tuple[int, int]:
    """(per-host batch, process count) from the config and JAX's devices."""
    import jax

    processes = jax.process_count()
    total = batch_size if batch_size is not None else config.global_batch_size(jax.device_count(), eval=eval)
    if total % processes:
        raise ValueError(f"the global batch of {total} does not divide over {processes} processes")
    return total // processes, processes


def train_dataset(config: MaxTextConfig, *, global_batch_size: int | None = None,
                  shard_options: ShardOptions | None = None) -> IterDataset:
    """The training stream of ``config``: endless (``num_epoch: null``) or ``num_epoch`` passes.

    Args:
        config: the checked settings.
        global_batch_size: rows per global batch (default: ``per_device_batch_size``
            times ``jax.device_count()``); each of the ``jax.process_count()`` hosts
            yields its share.
        shard_options: this host's shard (default: ``ShardByJaxProcess(drop_remainder=True)``).
    """
    per_host, _ = _hosts(global_batch_size, False, config)
    return _pipeline(
        config, files=config.train_files, column=config.train_column,
        tokenize=config.tokenize_train_data, shuffle=config.shuffle, num_epochs=config.num_epoch,
        batch_size=per_host, pad_last=False,
        shard_options=shard_options or ShardByJaxProcess(drop_remainder=True),
        workers=config.worker_count, buffer_size=config.per_worker_buffer_size,
        tok=tokenizer(config) if config.tokenize_train_data else None)


def eval_dataset(config: MaxTextConfig, *, global_batch_size: int | None = None,
                 shard_options: ShardOptions | None = None) -> IterDataset:
    """The eval stream: ``grain_eval_files`` once, in file order, every sequence kept; the
    last batch is padded and every batch has a ``mask`` of real rows.

    Across hosts the hosts may end after different numbers of batches; put the stream
    through :class:`~dataloader.maxtext.EvalBatches` to step them together.

    Raises:
        ValueError: the config has no ``grain_eval_files``.
    """
    if config.eval_files is None:
        raise ValueError("grain_eval_files is empty; name the eval files to build the eval pipeline")
    per_host, _ = _hosts(global_batch_size, True, config)
    return _pipeline(
        config, files=config.eval_files, column=config.eval_column,
        tokenize=config.tokenize_eval_data, shuffle=False, num_epochs=1, batch_size=per_host,
        pad_last=True, shard_options=shard_options or ShardByJaxProcess(drop_remainder=False),
        workers=config.worker_count_eval, buffer_size=config.per_worker_buffer_size_eval,
        tok=tokenizer(config) if config.tokenize_eval_data else None)


def train_iterator(config: MaxTextConfig, sharding: Any = None, *, global_batch_size: int | None = None,
                   cpu_buffer_size: int = 2, device_buffer_size: int = 2) -> Any:
    """The training batches as global ``jax.Array`` s, a few steps ahead on the devices.

    Args:
        sharding: where batches go: ``None`` splits the batch axis over every device of
            every process (``NamedSharding(Mesh(jax.devices(), ("data",)), P("data"))``),
            or any ``jax.sharding.Sharding`` / device.

    Returns:
        A ``DeviceIterator`` (``get_state``/``set_state``, ``dl.CheckpointSave`` works).
    """
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from dataloader.device.feed import device_prefetch

    if sharding is None:
        sharding = NamedSharding(Mesh(np.array(jax.devices()), ("data",)), PartitionSpec("data"))
    ds = train_dataset(config, global_batch_size=global_batch_size)
    return device_prefetch(iter(ds), sharding, cpu_buffer_size=cpu_buffer_size,
                           device_buffer_size=device_buffer_size)
