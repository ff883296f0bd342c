"""MaxText's pre-training input pipeline on granary: records -> tokens -> rows -> batches.

For the training stream, as MaxText's Grain pipeline does it (and the same for eval,
with the differences noted)::

    records   ArrayRecord or Parquet records by index, globally shuffled with
              data_shuffle_seed, num_epoch passes; or TFRecord files read in order,
              window-shuffled (:mod:`.reading`); one pattern, a weighted mixture of
              patterns, or named components (grain_train_mixture_config_path)
    text      each record's text (UTF-8, a JSON object's or a tf.train.Example's column;
              a Parquet row's column)
    tokens    Tokenize (tokenizer_path, add_bos, add_eos, trimmed under use_truncation)
    shard     this host's share: ShardByJaxProcess, interleaved after the global shuffle
              (TFRecord: this host's files)
    rows      packed (first_fit | best_fit | concat_then_split) into max_target_length,
              or one sequence per row, padded (packing: false)
    batches   per_device_batch_size * devices / processes rows per host; for training
              full batches only, for eval the last one padded with a ``mask`` (nothing
              dropped: batch_and_pad_with_mask)
    layout    MaxText's six arrays (:mod:`.format`)

For records read by index, the records, text and tokens steps run in
``grain_worker_count`` worker processes (a named mixture: each component has its own);
the packer and what follows run in this process on the ordered stream, so the batches
do not depend on the number of workers, and a state (a few hundred bytes) resumes
exactly. A named mixture's state keeps each component's under its name, so it restores
into a mixture with other weights or components. With ``grain_use_elastic_iterator``
the rows are padded, formatted and batched by ``ElasticIterator``, whose state restores
on another number of hosts. Global arrays across hosts come from the device feed:
:func:`train_iterator` puts the stream behind ``dl.device_prefetch`` with a sharding of
the batch axis over a mesh.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import numpy as np
from absl import logging

from dataloader.dataset.base import DatasetIterator, IterDataset
from dataloader.dataset.map_dataset import MapDataset
from dataloader.dataset.transformations.packing import (
    BestFitPackIterDataset,
    ConcatThenSplitIterDataset,
    FirstFitPackIterDataset,
)
from dataloader.maxtext import reading
from dataloader.maxtext.config import MaxTextConfig
from dataloader.maxtext.format import MaxTextFormat, PadToLength
from dataloader.maxtext.mixture import mixture_parts, mixture_weights
from dataloader.maxtext.records import parse_example
from dataloader.operations import MapTransform, Tokenize
from dataloader.operations.packing import BOSHandling
from dataloader.operations.padding import batch_and_pad_with_mask
from dataloader.options import AutoWorkers, MultiprocessingOptions, ReadOptions
from dataloader.samplers import ShardByJaxProcess, ShardOptions


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


def _tokens(config: MaxTextConfig, ds: Any, column: str, tok: Tokenize | None) -> Any:
    """Records -> ``{"tokens": ids}`` (a ``MapDataset`` or an ``IterDataset``)."""
    ds = ds.map(TextOf(config.record_format, column))
    return ds.map(tok) if tok is not None else ds.map(_token_ids)


def _meminfo() -> dict[str, int]:
    """``MemTotal`` and ``MemAvailable`` in bytes as this process sees them: the host's
    ``/proc/meminfo`` bounded by its container's memory limit (the limit, and the limit
    less what the container uses; :mod:`~dataloader.engine.pool.autoscale.limits`).
    Empty where neither is known."""
    from dataloader.engine.pool.autoscale.limits import read_limits

    found = read_limits()
    total, available = found.total_memory, found.available_memory
    return {} if total is None or available is None else {"MemTotal": total, "MemAvailable": available}


def auto_workers(ram_budget_mb: int, meminfo: dict[str, int] | None = None) -> AutoWorkers:
    """``worker_count="auto"`` whose workers may take ``ram_budget_mb`` of the memory
    available now (MaxText's ``grain_ram_budget_mb``): the pool adds a worker only while
    ``min_free_memory`` of the memory stays available, here what is available now less
    the budget. In a container, memory is the container's (its limit, and the limit
    less its use), so a budget larger than the container allows gives
    ``min_free_memory=0``: the pool stops at the container's limit, not the host's.
    Without ``/proc/meminfo``, ``AutoWorkers()``'s own bound.

    Example:
        >>> auto_workers(1024, {"MemTotal": 8 << 30, "MemAvailable": 4 << 30}).min_free_memory
        0.375
    """
    info = _meminfo() if meminfo is None else meminfo
    total, available = info.get("MemTotal"), info.get("MemAvailable")
    if not total or available is None:
        return AutoWorkers()
    keep = (available - ram_budget_mb * 2**20) / total
    return AutoWorkers(min_free_memory=min(max(keep, 0.0), 0.99))


def read_options(config: MaxTextConfig, *, eval: bool = False) -> ReadOptions:
    """``grain_num_threads`` and ``grain_prefetch_buffer_size`` (``_eval``) as the read-ahead
    of the in-process path (used with 0 workers): records read ahead, as in Grain."""
    threads = config.num_threads_eval if eval else config.num_threads
    records = config.prefetch_buffer_size_eval if eval else config.prefetch_buffer_size
    return ReadOptions(num_threads=threads, prefetch_buffer_size=records)


def _note_stream_workers(config: MaxTextConfig, *, eval: bool) -> None:
    """One log line where MaxText would read TFRecord files in worker processes."""
    key = "grain_worker_count_eval" if eval else "grain_worker_count"
    count = config.worker_count_eval if eval else config.worker_count
    if count:
        logging.info("granary: %s=%r with grain_file_type tfrecord: the files are read and tokenized in "
                     "this process (a prefetch thread), in order; worker processes compute only "
                     "records read by index (arrayrecord, parquet)", key, count)


def _read(config: MaxTextConfig, files: str, *, column: str, tok: Tokenize | None, shuffle: bool,
          num_epochs: int | None, shard_options: ShardOptions, eval: bool) -> IterDataset:
    """One pattern, or a ``;`` mixture of patterns, tokenized and sharded."""
    threads = config.num_threads_eval if eval else config.num_threads
    parts = mixture_parts(files)
    if config.file_type != "arrayrecord" and len(parts) > 1:
        raise ValueError(f"a mixture of files ({files!r}) works with grain_file_type: arrayrecord only, "
                         f"as in MaxText; for {config.file_type} name the components in a "
                         f"grain_train_mixture_config_path file")
    if config.file_type == "tfrecord":
        _note_stream_workers(config, eval=eval)
        stream = reading.file_stream(config, files, shuffle=shuffle, num_epochs=num_epochs,
                                     shard_options=shard_options, num_threads=threads)
        return _tokens(config, stream, column, tok)
    sources = reading.open_sources(config, [pattern for pattern, _ in parts])
    components = [reading.indexed_records(config, source, shuffle=shuffle, num_epochs=num_epochs,
                                          seed=config.seed + c) for c, source in enumerate(sources)]
    ds = components[0] if len(components) == 1 else MapDataset.mix(components, [w for _, w in parts])
    return _tokens(config, ds, column, tok).to_iter_dataset(read_options(config, eval=eval),
                                                          shard_options=shard_options)


def _read_named(config: MaxTextConfig, *, tok: Tokenize | None, shard_options: ShardOptions) -> IterDataset:
    """The named mixture of ``grain_train_mixture_config_path``: ``IterDataset.mix`` of a
    dict, whose state restores by name. Every component is shuffled with
    ``data_shuffle_seed`` (as in MaxText), so a component keeps its order whatever else
    is mixed."""
    mixture = config.train_mixture
    assert mixture is not None
    column, epochs = config.train_column, config.num_epoch
    components: dict[str, IterDataset] = {}
    if config.file_type == "tfrecord":
        _note_stream_workers(config, eval=False)
        for c in mixture:
            stream = reading.file_stream(config, c.path, shuffle=config.shuffle, num_epochs=epochs,
                                         shard_options=shard_options, num_threads=config.num_threads)
            components[c.name] = _tokens(config, stream, column, tok)
    else:
        sources = reading.open_sources(config, [c.path for c in mixture])
        for c, source in zip(mixture, sources):
            records = reading.indexed_records(config, source, shuffle=config.shuffle, num_epochs=epochs,
                                              seed=config.seed)
            components[c.name] = _tokens(config, records, column, tok).to_iter_dataset(
                read_options(config), shard_options=shard_options)
    return IterDataset.mix(components, mixture_weights(mixture))


def _rows_and_batches(config: MaxTextConfig, stream: IterDataset, *, batch_size: int, pad_last: bool,
                      tok: Tokenize | None, workers: int | str, buffer_size: int) -> IterDataset:
    length = config.max_target_length
    rows: IterDataset
    if not config.packing:
        rows = stream.map(PadToLength(length))
    elif config.packing_type == "concat_then_split":
        bos = {} if not (tok is not None and config.add_bos) else {
            "bos_handling": BOSHandling.INSERT_BOS, "bos_features": ["tokens"],
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
    return out.mp_prefetch(MultiprocessingOptions(num_workers=_workers(config, workers),
                                                  per_worker_buffer_size=buffer_size))


def _workers(config: MaxTextConfig, count: int | str) -> int | AutoWorkers:
    """A worker count, with MaxText's -1 (``"auto"``) held to ``grain_ram_budget_mb``."""
    if isinstance(count, str):  # "auto", the only string the config lets through
        return auto_workers(config.ram_budget_mb)
    return count


class ElasticDataset(IterDataset):
    """``grain_use_elastic_iterator``: each ``iter()`` is an ``ElasticIterator`` over the
    padded, formatted rows, batched ``global_batch_size / shard_count`` per host; its
    state (``global_next_index``) restores on any host count that divides it."""

    def __init__(self, rows: MapDataset, global_batch_size: int, shard_options: ShardOptions,
                 read_options: ReadOptions, workers: int | AutoWorkers, buffer_size: int) -> None:
        super().__init__()
        self._rows, self._global, self._shard_options = rows, global_batch_size, shard_options
        self._read_options = read_options
        self._mp = MultiprocessingOptions(num_workers=workers, per_worker_buffer_size=buffer_size) if workers else None

    def __iter__(self) -> DatasetIterator:
        from dataloader.dataset.experimental.elastic import ElasticIterator

        return ElasticIterator(self._rows, self._global, self._shard_options, read_options=self._read_options,
                               multiprocessing_options=self._mp)

    def __repr__(self) -> str:
        return f"ElasticDataset({self._rows!r}, global_batch_size={self._global})"


def _elastic(config: MaxTextConfig, *, per_host: int, shard_options: ShardOptions, tok: Tokenize | None) -> IterDataset:
    assert config.train_files is not None
    (source,) = reading.open_sources(config, [config.train_files])
    records = reading.indexed_records(config, source, shuffle=config.shuffle, num_epochs=config.num_epoch,
                                      seed=config.seed)
    rows = _tokens(config, records, config.train_column, tok).map(PadToLength(config.max_target_length))
    return ElasticDataset(rows.map(MaxTextFormat(pad_id=0)), per_host * shard_options.shard_count, shard_options,
                          read_options(config), _workers(config, config.worker_count),
                          config.per_worker_buffer_size)


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
    shard_options = shard_options or ShardByJaxProcess(drop_remainder=True)
    tok = tokenizer(config) if config.tokenize_train_data else None
    if config.use_elastic_iterator:
        return _elastic(config, per_host=per_host, shard_options=shard_options, tok=tok)
    if config.train_mixture is not None:
        stream = _read_named(config, tok=tok, shard_options=shard_options)
    else:
        assert config.train_files is not None
        stream = _read(config, config.train_files, column=config.train_column, tok=tok, shuffle=config.shuffle,
                       num_epochs=config.num_epoch, shard_options=shard_options, eval=False)
    return _rows_and_batches(config, stream, batch_size=per_host, pad_last=False, tok=tok,
                             workers=config.worker_count, buffer_size=config.per_worker_buffer_size)


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
    tok = tokenizer(config) if config.tokenize_eval_data else None
    stream = _read(config, config.eval_files, column=config.eval_column, tok=tok, shuffle=False, num_epochs=1,
                   shard_options=shard_options or ShardByJaxProcess(drop_remainder=False), eval=True)
    return _rows_and_batches(config, stream, batch_size=per_host, pad_last=True, tok=tok,
                             workers=config.worker_count_eval, buffer_size=config.per_worker_buffer_size_eval)


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
