"""Declarative pipeline configs: YAML files with ``key.sub=value`` overrides.

A config names the whole input pipeline; :func:`load_config` reads and checks it, and
the returned :class:`PipelineConfig` builds the loader::

    description: digits, decoded and batched            # free text (optional)
    source:
      kind: array_record             # array_record | parquet | an import path
      paths: data/train-*.array_record   # a path, a glob or a list (from the cwd)
      options: {}                    # keyword arguments of the source
    mixture: null                    # or, in place of source:, named sources mixed by weight
                                     # (fixed or a schedule; see dataloader.config.mixture)
    sampler:
      shuffle: true
      seed: 42                       # needed when shuffling
      num_epochs: 1                  # null: repeat for ever
      sharding: none                 # none | jax | {shard_index: 0, shard_count: 2}
      drop_remainder: false          # shards of equal length
    operations:                      # see dataloader.config.operations
      - map: mypkg.decode
      - batch: {batch_size: 64, drop_remainder: true}
    loader:
      worker_count: 2                # or auto; auto_workers: {max_workers: 8} tunes it
      worker_buffer_size: 2
      worker_kind: processes         # threads (work that releases the GIL) | auto (measured)
      warm_start: false              # true: compute here until a worker is ready (runs user code here)
      stall_warning_s: 60            # log a unit stuck this long in a worker (null: never)
      unit_timeout_s: null           # a unit stuck this long is an error (null: never)
      read_options: {num_threads: 0, prefetch_buffer_size: 500}  # records read ahead by threads (worker_count 0)
      end: null                      # pad (or {lookahead: 8, mask_key: mask}): finite data ends on one step on every host
      ray: null                      # or {address: auto, num_workers: 8, resources: {data: 1}}:
                                     # units on Ray actors (dl.RayExecutor; worker_count 0)
      audit_log: null                # or audit-{shard}.jsonl: a JSON line per step (docs/fingerprint-audit.md)
      fingerprint: null              # false: no per-step fingerprint, no restore audit (null: $GRANARY_FINGERPRINT, else on)
    device:                          # the device queue (device_prefetch)
      enabled: false
      cpu_buffer_size: 2
      device_buffer_size: 2
      shard_batch: false             # true: split the batch axis over all devices
    train: {}                        # free mapping for the program running the config

Everything is checked when the config is loaded: unknown keys, wrong types
(``"sampler.seed: expected an integer, got 'abc'"``), files that do not exist,
operations that do not import or are not operations, arguments a function does not
take. Each message starts with the key. Loading opens no data file; the
``build_*`` methods construct the objects.

Example:
    >>> config = load_config("demo", ["loader.worker_count=0"])  # doctest: +SKIP
    >>> loader = config.build_loader()                                         # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from typing import Any

from dataloader.config import checks as check
from dataloader.config.mixture import MixtureConfig, parse_mixture
from dataloader.config.operations import build_operations
from dataloader.config.overrides import apply_overrides
from dataloader.config.shipped import config_file
from dataloader.config.source import SourceConfig, parse_source
from dataloader.engine.stages.finite import PadEnd
from dataloader.errors import ConfigError
from dataloader.loader import DataLoader
from dataloader.options import DEFAULT_STALL_WARNING_S, WORKER_KINDS, AutoWorkers, ReadOptions
from dataloader.samplers import IndexSampler, NoSharding, ShardByJaxProcess, ShardOptions

_TOP = ("description", "source", "mixture", "sampler", "operations", "loader", "device", "train")


@dataclasses.dataclass(frozen=True)
class SamplerConfig:
    """``sampler:``: order, epochs and sharding; becomes an :class:`IndexSampler`."""

    shuffle: bool = False
    seed: int | None = None
    num_epochs: int | None = 1
    sharding: str | tuple[int, int] = "none"
    drop_remainder: bool = False

    def shard_options(self) -> ShardOptions:
        if self.sharding == "jax":
            return ShardByJaxProcess(drop_remainder=self.drop_remainder)
        if self.sharding == "none":
            return NoSharding(drop_remainder=self.drop_remainder)
        assert isinstance(self.sharding, tuple)
        index, count = self.sharding
        return ShardOptions(index, count, drop_remainder=self.drop_remainder)

    def build(self, num_records: int, *, in_order: bool = False) -> IndexSampler:
        """The sampler over ``num_records``; ``in_order``: positions unshuffled (a
        mixture, whose sources are shuffled each on its own)."""
        return IndexSampler(
            num_records, self.shard_options(), shuffle=self.shuffle and not in_order,
            num_epochs=self.num_epochs, seed=self.seed,
        )


@dataclasses.dataclass(frozen=True)
class LoaderConfig:
    """``loader:``: worker processes and buffers (none of it changes the output), and
    ``end`` (``DataLoader(end=...)``: pad the last batches so every host stops together)."""

    worker_count: int | AutoWorkers = 0
    worker_buffer_size: int = 2
    warm_start: bool = False
    read_options: ReadOptions = dataclasses.field(default_factory=ReadOptions)
    stall_warning_s: float | None = DEFAULT_STALL_WARNING_S
    unit_timeout_s: float | None = None
    end: PadEnd | None = None
    # ``ray:``: keyword arguments of dl.RayExecutor (checked), or None: no Ray.
    ray: dict[str, Any] | None = None
    # ``audit_log:``: DataLoader(audit_log=...), a path ({shard}: the shard index) or None.
    audit_log: str | None = None
    # ``fingerprint:``: DataLoader(fingerprint=...); None: $GRANARY_FINGERPRINT, else on.
    fingerprint: bool | None = None
    # ``worker_kind:``: processes, threads or auto (None: GRANARY_WORKER_KIND, else processes).
    worker_kind: str | None = None

    def executor(self) -> Any:
        """The :class:`~dataloader.RayExecutor` that ``ray:`` asks for (joins the
        cluster now), or None."""
        if self.ray is None:
            return None
        from dataloader.engine.remote.ray_executor import RayExecutor  # imports Ray

        return RayExecutor(**self.ray)


@dataclasses.dataclass(frozen=True)
class DeviceConfig:
    """``device:``: keep batches on the accelerator ahead of the training step."""

    enabled: bool = False
    cpu_buffer_size: int = 2
    device_buffer_size: int = 2
    shard_batch: bool = False

    def target(self) -> Any:
        """``None`` (first local device), or a sharding splitting the batch over all devices."""
        if not self.shard_batch:
            return None
        import jax
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        return NamedSharding(Mesh(jax.devices(), ("data",)), PartitionSpec("data"))


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    """A checked pipeline config; build the loader with :meth:`build_loader`.

    Attributes:
        data: the config as a plain dict, overrides applied (``yaml.safe_dump``-able).
        train: the free-form ``train:`` mapping, for the program that runs the config.

    Example:
        >>> config = parse_config({"source": {"kind": "dataloader.sources.RangeDataSource",
        ...                                   "options": {"start": 10}},
        ...                        "operations": [{"batch": 5}]})
        >>> [b.tolist() for b in config.build_loader()]
        [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    """

    data: dict[str, Any]
    source: SourceConfig | None
    sampler: SamplerConfig
    operations: tuple[Any, ...]
    loader: LoaderConfig
    device: DeviceConfig
    train: dict[str, Any]
    # ``mixture:`` (in place of ``source:``): the sources mixed by weight, or None.
    mixture: MixtureConfig | None = None

    def build_source(self) -> Any:
        """The source (``source:``), or the mixture as one random-access dataset
        (``mixture:``; :mod:`dataloader.config.mixture`)."""
        if self.mixture is not None:
            sampler = self.sampler
            return self.mixture.build(sampler.shuffle, sampler.seed, sampler.num_epochs)
        assert self.source is not None, "parse_config needs source: or mixture:"
        return self.source.build()

    def build_loader(self, source: Any = None) -> DataLoader:
        """A :class:`DataLoader` for this config (over ``source`` if given)."""
        source = self.build_source() if source is None else source
        # A mixture repeats its sources itself (sampler.num_epochs passes over each): one
        # pass over its positions, in order.
        sampler = self.sampler if self.mixture is None else dataclasses.replace(self.sampler, num_epochs=1)
        return DataLoader(
            source,
            sampler.build(len(source), in_order=self.mixture is not None),
            list(self.operations),
            worker_count=self.loader.worker_count,
            worker_buffer_size=self.loader.worker_buffer_size,
            worker_kind=self.loader.worker_kind,
            read_options=self.loader.read_options,
            warm_start=self.loader.warm_start,
            stall_warning_s=self.loader.stall_warning_s,
            unit_timeout_s=self.loader.unit_timeout_s,
            end=self.loader.end,
            executor=self.loader.executor(),
            audit_log=self.loader.audit_log,
            fingerprint=self.loader.fingerprint,
        )

    def build_iterator(self, loader: DataLoader | None = None, state: Any = None) -> Any:
        """The loader's iterator (from ``state`` if given), behind the device queue
        when ``device.enabled``."""
        loader = self.build_loader() if loader is None else loader
        return self.on_device(loader.iterator(state))

    def on_device(self, iterator: Any) -> Any:
        """``iterator`` behind the device queue when ``device.enabled``, else itself."""
        if not self.device.enabled:
            return iterator
        from dataloader.device.feed import device_prefetch  # imports JAX

        return device_prefetch(
            iterator,
            self.device.target(),
            cpu_buffer_size=self.device.cpu_buffer_size,
            device_buffer_size=self.device.device_buffer_size,
        )


def _source(section: Any, check_files: bool = True) -> SourceConfig:
    section = check.mapping("source", section)
    if not section:
        raise check.fail("source", "missing; say what to read, e.g. {kind: array_record, paths: ...}, "
                                   "or mix several sources under mixture:")
    return parse_source("source", section, check_files)


def _sampler(section: Any) -> SamplerConfig:
    where = "sampler"
    section = check.mapping(where, section)
    check.known_keys(where, section, ("shuffle", "seed", "num_epochs", "sharding", "drop_remainder"))
    shuffle = check.boolean(f"{where}.shuffle", section.get("shuffle", False))
    seed = check.optional_integer(f"{where}.seed", section.get("seed"), low=0)
    if shuffle and seed is None:
        raise check.fail(f"{where}.seed", "sampler.shuffle is true, so an integer seed is needed; add e.g. seed: 42")
    epochs = check.optional_integer(f"{where}.num_epochs", section.get("num_epochs", 1), low=1)
    sharding: Any = section.get("sharding", "none")
    if isinstance(sharding, Mapping):
        sharding = check.mapping(f"{where}.sharding", sharding)
        check.known_keys(f"{where}.sharding", sharding, ("shard_index", "shard_count"))
        count = check.integer(f"{where}.sharding.shard_count", check.get(sharding, "shard_count", where=f"{where}.sharding"), low=1)
        index = check.integer(f"{where}.sharding.shard_index", check.get(sharding, "shard_index", where=f"{where}.sharding"), low=0)
        if index >= count:
            raise check.fail(f"{where}.sharding.shard_index", f"expected an integer below shard_count={count}, got {index}")
        sharding = (index, count)
    elif sharding is None:
        sharding = "none"
    else:
        check.string(f"{where}.sharding", sharding, choices=("none", "jax"))
    drop = check.boolean(f"{where}.drop_remainder", section.get("drop_remainder", False))
    return SamplerConfig(shuffle, seed, epochs, sharding, drop)


def _loader(section: Any) -> LoaderConfig:
    where = "loader"
    section = check.mapping(where, section)
    check.known_keys(
        where,
        section,
        ("worker_count", "auto_workers", "worker_buffer_size", "worker_kind", "warm_start",
         "stall_warning_s", "unit_timeout_s", "read_options", "end", "ray", "audit_log", "fingerprint"),
    )
    kind = section.get("worker_kind")
    if kind is not None and kind not in WORKER_KINDS:
        raise check.fail(f"{where}.worker_kind", f"expected processes, threads or auto, got {kind!r}")
    workers = _worker_count(where, section)
    buffer = check.integer(f"{where}.worker_buffer_size", section.get("worker_buffer_size", 2), low=1)
    warm = check.boolean(f"{where}.warm_start", section.get("warm_start", False))
    stall = section.get("stall_warning_s", DEFAULT_STALL_WARNING_S)
    if stall is not None:
        stall = check.number(f"{where}.stall_warning_s", stall, positive=True)
    timeout = section.get("unit_timeout_s")
    if timeout is not None:
        timeout = check.number(f"{where}.unit_timeout_s", timeout, positive=True)
        if not workers:
            raise check.fail(
                f"{where}.unit_timeout_s",
                "needs loader.worker_count > 0 (a unit computed in the training process "
                "cannot be stopped); with Ray actors set loader.ray.unit_timeout_s instead",
            )
    read = check.mapping(f"{where}.read_options", section.get("read_options"))
    keys = ("num_threads", "prefetch_buffer_size", "unit_size", "prefetch_buffer_bytes")
    check.known_keys(f"{where}.read_options", read, keys)
    for key in keys:
        if key in read:
            check.optional_integer(f"{where}.read_options.{key}", read[key])
    try:
        read_options = ReadOptions(**read)
    except ValueError as error:
        raise check.fail(f"{where}.read_options", str(error)) from None
    ray = _ray(f"{where}.ray", section.get("ray"))
    if ray is not None and workers:
        raise check.fail(f"{where}.ray", "computes the units: set loader.worker_count to 0 with it")
    audit_log = section.get("audit_log")
    if audit_log is not None:
        audit_log = check.string(f"{where}.audit_log", audit_log)
    fingerprint = section.get("fingerprint")
    if fingerprint is not None:
        fingerprint = check.boolean(f"{where}.fingerprint", fingerprint)
    return LoaderConfig(
        workers, buffer, warm, read_options, stall, timeout, _end(f"{where}.end", section.get("end")), ray,
        audit_log, fingerprint, kind,
    )


def _ray(where: str, value: Any) -> dict[str, Any] | None:
    """``ray:``: null, or a mapping of :class:`~dataloader.RayExecutor` arguments
    (checked here; the cluster is joined when the loader is built)."""
    if value is None:
        return None
    section = check.mapping(where, value)
    check.known_keys(where, section, ("address", "num_workers", "local_workers", "num_cpus_per_worker",
                                      "resources", "units_per_worker", "start_timeout_s",
                                      "stall_warning_s", "unit_timeout_s"))
    if section.get("address") is not None:
        check.string(f"{where}.address", section["address"])
    for key, low in (("num_workers", 0), ("local_workers", 0), ("units_per_worker", 1)):
        if key in section:
            check.integer(f"{where}.{key}", section[key], low=low)
    if section.get("num_workers", 2) + section.get("local_workers", 0) < 1:
        raise check.fail(f"{where}.num_workers", "expected at least one actor (num_workers >= 1)")
    if "num_cpus_per_worker" in section:
        check.number(f"{where}.num_cpus_per_worker", section["num_cpus_per_worker"])
    for key in ("start_timeout_s", "stall_warning_s", "unit_timeout_s"):
        if section.get(key) is not None:
            check.number(f"{where}.{key}", section[key], positive=True)
    resources = check.mapping(f"{where}.resources", section.get("resources"))
    for name, amount in resources.items():
        check.number(f"{where}.resources.{name}", amount)
    return section


def _end(where: str, value: Any) -> PadEnd | None:
    """``end``: null, ``pad``, or a mapping of :class:`~dataloader.PadEnd` fields."""
    if value is None:
        return None
    if value == "pad":
        return PadEnd()
    if not isinstance(value, Mapping):
        raise check.fail(where, f"expected null, pad or a mapping {{lookahead: 8, mask_key: mask}}, got {value!r}")
    settings = check.mapping(where, value)
    check.known_keys(where, settings, ("lookahead", "mask_key"))
    try:
        return PadEnd(**settings)
    except (TypeError, ValueError) as error:
        raise check.fail(where, str(error)) from None


def _worker_count(where: str, section: dict[str, Any]) -> int | AutoWorkers:
    """``worker_count``: an integer >= 0, or ``auto``, tuned by an ``auto_workers:``
    mapping of :class:`~dataloader.AutoWorkers` fields."""
    value = section.get("worker_count", 0)
    tuning = section.get("auto_workers")
    if value != "auto":
        if tuning is not None:
            raise check.fail(f"{where}.auto_workers", "needs loader.worker_count: auto")
        if isinstance(value, str):
            raise check.fail(f"{where}.worker_count", f"expected an integer >= 0 or auto, got {value!r}")
        return check.integer(f"{where}.worker_count", value, low=0)
    fields = [f.name for f in dataclasses.fields(AutoWorkers)]
    tuning = check.mapping(f"{where}.auto_workers", tuning)
    check.known_keys(f"{where}.auto_workers", tuning, fields)
    try:
        return AutoWorkers(**tuning)
    except (TypeError, ValueError) as error:
        raise check.fail(f"{where}.auto_workers", str(error)) from None


def _device(section: Any) -> DeviceConfig:
    where = "device"
    section = check.mapping(where, section)
    check.known_keys(where, section, ("enabled", "cpu_buffer_size", "device_buffer_size", "shard_batch"))
    return DeviceConfig(
        check.boolean(f"{where}.enabled", section.get("enabled", False)),
        check.integer(f"{where}.cpu_buffer_size", section.get("cpu_buffer_size", 2), low=1),
        check.integer(f"{where}.device_buffer_size", section.get("device_buffer_size", 2), low=1),
        check.boolean(f"{where}.shard_batch", section.get("shard_batch", False)),
    )


def parse_config(
    data: Mapping[str, Any], overrides: Iterable[str] = (), *, check_files: bool = True
) -> PipelineConfig:
    """Checks a config given as a dict (e.g. parsed YAML) and applies ``overrides``.

    With ``check_files=False`` the source's paths are not looked up (everything else is
    checked), so a config can be validated before the data it names is written.

    Raises:
        ConfigError: naming the key, what was expected and what was found.
    """
    data = check.mapping("config", data)
    data = apply_overrides(data, overrides)
    check.known_keys("", data, _TOP)
    if "description" in data and data["description"] is not None:
        check.string("description", data["description"])
    sampler = _sampler(data.get("sampler"))
    operations = tuple(build_operations("operations", data.get("operations")))
    if sampler.seed is None and any(getattr(op, "needs_seed", False) for op in operations):
        raise check.fail("sampler.seed", "the pipeline has a random_map, which needs a seed; add e.g. seed: 42")
    loader = _loader(data.get("loader"))
    if loader.audit_log is not None and sampler.sharding != "none" and "{shard}" not in loader.audit_log:
        raise check.fail(
            "loader.audit_log",
            f"{loader.audit_log!r} would be written by every shard (sampler.sharding: "
            f"{sampler.sharding}); put {{shard}} in it, e.g. audit-{{shard}}.jsonl",
        )
    if data.get("mixture") is not None and data.get("source") is not None:
        raise check.fail("mixture", "a config reads source: or mixture:, not both; move the source "
                                    "under mixture.sources with a name")
    mixture = None if data.get("mixture") is None else parse_mixture(data["mixture"], check_files)
    return PipelineConfig(
        data=data,
        source=None if mixture is not None else _source(data.get("source"), check_files),
        sampler=sampler,
        operations=operations,
        loader=loader,
        device=_device(data.get("device")),
        train=check.mapping("train", data.get("train")),
        mixture=mixture,
    )


def load_config(
    path: str | os.PathLike, overrides: Iterable[str] = (), *, check_files: bool = True
) -> PipelineConfig:
    """Reads a YAML pipeline config, applies ``key.sub=value`` overrides, checks it.

    A config is code: it imports the modules its import paths name (running their
    top-level code), and the loader calls the callables named, so load only configs
    (and overrides) you would run as a Python script.

    Args:
        path: the YAML file, or the name of a config shipped with granary
            (``"array_record_images"``, ``.yaml`` optional; see
            :func:`~dataloader.config.shipped_config`), read when no file of that name exists.
        overrides: strings like ``"sampler.seed=7"`` or ``"operations.1.batch.batch_size=32"``
            (values are read as YAML), applied in order.
        check_files: look up the source's paths (False: check everything else, e.g.
            before the data is written).

    Raises:
        ConfigError: the file is missing or not YAML, or a key is unknown, has the
            wrong type, or names a missing file or an unknown operation; the message
            starts with the key.
    """
    path = config_file(path)
    data = check.read_yaml_file(path)
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: expected a mapping of sections (source:, sampler:, ...), got {data!r}")
    return parse_config(data, overrides, check_files=check_files)
