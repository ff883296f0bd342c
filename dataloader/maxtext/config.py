"""MaxText's data keys, read and checked: a MaxText user points granary at their settings.

MaxText configures its Grain input pipeline with flat keys in its YAML (``base.yml``)
and ``key=value`` overrides on the command line. Every ``grain_*`` key of MaxText's
``base.yml`` is read here, with MaxText's default, and so are the other keys its Grain
pipeline reads. "Logged" means: accepted, and where the value asks for something granary
does not do, one ``absl`` log line says so and what granary does instead.

====================================  ===============  =========================================
key                                   default          meaning here
====================================  ===============  =========================================
``grain_train_files``                 (required)       a path or glob, or a mixture
                                                       ``"a*.array_record,0.3;b*.array_record,0.7"``
                                                       (MaxText's ``,``; ``:`` works too); not
                                                       needed with a mixture file
``grain_train_mixture_config_path``   ``""``           a JSON file of named components
                                                       (:mod:`.mixture`); when given, it is
                                                       read instead of ``grain_train_files``
                                                       (for every file type; MaxText reads it
                                                       for ``arrayrecord`` only)
``grain_eval_files``                  ``""``           the same, for the eval pipeline (one pass)
``grain_file_type``                   ``arrayrecord``  ``arrayrecord``, ``parquet`` (both read
                                                       by index) or ``tfrecord`` (read as file
                                                       streams, :mod:`.reading`)
``grain_packing_type``                ``first_fit``    ``first_fit``, ``best_fit``, ``concat_then_split``
``grain_worker_count``                1                worker processes (``_eval`` for eval);
                                                       -1: ``"auto"``, the pool picks its count.
                                                       TFRecord streams are read and tokenized in
                                                       this process (logged), not in workers
``grain_per_worker_buffer_size``      1                work units in flight per worker (``_eval``)
``grain_ram_budget_mb``               1024             with a worker count of -1: the memory the
                                                       auto-scaled workers may take, in MB (as
                                                       ``AutoWorkers.min_free_memory``: what is
                                                       available when the pipeline is built, less
                                                       the budget, stays free)
``grain_num_threads``                 16               with 0 workers: threads reading ahead
                                                       (``ReadOptions.num_threads``); TFRecord:
                                                       files interleaved at most (``_eval`` too)
``grain_prefetch_buffer_size``        500              with 0 workers: records read ahead
                                                       (``ReadOptions``; ``_eval``)
``grain_data_source_max_workers``     16               threads that open a mixture's sources
``grain_index_storage_option``        null             ArrayRecord index: null (the reader's
                                                       default), ``in_memory`` or ``offloaded``
``grain_shuffle_buffer_size``         100              TFRecord: the window of the record shuffle
                                                       (ArrayRecord and Parquet are shuffled
                                                       globally, by index)
``grain_use_elastic_iterator``        false            read through ``ElasticIterator``: states
                                                       restore on another host count; needs
                                                       ``packing: false``, ArrayRecord/Parquet,
                                                       no mixture (as in MaxText)
``packing``                           true             pack sequences into rows (else pad each)
``max_target_length``                 2048             the row length
``max_segments_per_seq``              -1               most sequences per row (-1: any), for
                                                       ``first_fit`` and ``best_fit`` (MaxText:
                                                       ``first_fit`` only)
``per_device_batch_size``             12.0             times the device count: the global batch
``eval_per_device_batch_size``        0.0              0: as ``per_device_batch_size``
``enable_data_shuffling``             true             shuffle the records (train)
``data_shuffle_seed``                 0                the seed of every shuffle and packer
``num_epoch``                         1                passes over the training data (null: for ever)
``tokenizer_path``                    (required)       see :class:`~dataloader.operations.Tokenize`
``tokenizer_type``                    ``sentencepiece``  ``sentencepiece``, ``huggingface``, ``tiktoken``
``add_bos``, ``add_eos``              true
``use_truncation``                    true             trim each text to ``max_target_length`` tokens
``tokenize_train_data``               true             false: the column holds token ids already
``tokenize_eval_data``                true
``train_data_columns``                ``['text']``     the record's text column (one)
``eval_data_columns``                 ``['text']``
``dataset_type``                      (``grain``)      must be ``grain`` (MaxText's base.yml says
                                                       ``tfds``: set ``dataset_type=grain``)
``use_dpo``, ``use_sft``              false            true is refused: granary builds MaxText's
                                                       pre-training pipeline only
``generate_padding_batch_eval``       false            granary's :class:`~.EvalBatches` pads the
                                                       hosts whose eval data ended, either way
``generate_padding_batch_train``      false            logged when true: the training stream
                                                       ends with its data (``num_epoch``)
``colocated_python_data_input``       false            logged when true: granary loads in each
                                                       training process (no Pathways colocated
                                                       Python)
``expansion_factor_real_data``        -1.0             logged when not -1: every process loads
                                                       its share; to resume on another host
                                                       count, use ``grain_use_elastic_iterator``
``record_format``                     (by file type)   granary's own: records as UTF-8 ``text``,
                                                       ``json`` objects, or ``tf_example``
                                                       (serialized ``tf.train.Example``, what
                                                       MaxText's data sets hold); default
                                                       ``tf_example`` for TFRecord, else ``text``
====================================  ===============  =========================================

Any other key is an error naming it (with the nearest known key), unless the caller
lists it in ``other_keys`` (a training program's own keys: steps, model sizes) or passes
``ignore_unknown=True`` to read a whole MaxText config, in which case only unknown keys
that start with ``grain_`` are refused. A whole ``base.yml`` reads with the overrides
MaxText's own Grain pipeline needs::

    load_maxtext_config("base.yml", ["dataset_type=grain", "grain_train_files=...",
                                     "tokenizer_path=..."], ignore_unknown=True)
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from absl import logging

from dataloader.config import checks as check
from dataloader.config.overrides import apply_overrides
from dataloader.config.shipped import config_file
from dataloader.errors import ConfigError
from dataloader.maxtext.mixture import KEY as KEY_MIXTURE
from dataloader.maxtext.mixture import Component, load_mixture_config

DEFAULTS: dict[str, Any] = {
    "grain_train_files": "",
    "grain_train_mixture_config_path": "",
    "grain_eval_files": "",
    "grain_file_type": "arrayrecord",
    "grain_packing_type": "first_fit",
    "grain_worker_count": 1,
    "grain_worker_count_eval": 1,
    "grain_per_worker_buffer_size": 1,
    "grain_per_worker_buffer_size_eval": 1,
    "grain_ram_budget_mb": 1024,
    "grain_num_threads": 16,
    "grain_num_threads_eval": 16,
    "grain_prefetch_buffer_size": 500,
    "grain_prefetch_buffer_size_eval": 500,
    "grain_data_source_max_workers": 16,
    "grain_index_storage_option": None,
    "grain_shuffle_buffer_size": 100,
    "grain_use_elastic_iterator": False,
    "packing": True,
    "max_target_length": 2048,
    "max_segments_per_seq": -1,
    "per_device_batch_size": 12.0,
    "eval_per_device_batch_size": 0.0,
    "enable_data_shuffling": True,
    "data_shuffle_seed": 0,
    "num_epoch": 1,
    "tokenizer_path": "",
    "tokenizer_type": "sentencepiece",
    "add_bos": True,
    "add_eos": True,
    "use_truncation": True,
    "tokenize_train_data": True,
    "tokenize_eval_data": True,
    "train_data_columns": ["text"],
    "eval_data_columns": ["text"],
    "dataset_type": "grain",
    "use_dpo": False,
    "use_sft": False,
    "generate_padding_batch_train": False,
    "generate_padding_batch_eval": False,
    "colocated_python_data_input": False,
    "expansion_factor_real_data": -1.0,
    "record_format": None,
}
FILE_TYPES = ("arrayrecord", "parquet", "tfrecord")
PACKING_TYPES = ("first_fit", "best_fit", "concat_then_split")
TOKENIZER_TYPES = ("sentencepiece", "huggingface", "tiktoken")
RECORD_FORMATS = ("text", "json", "tf_example")
INDEX_STORAGE_OPTIONS = ("in_memory", "offloaded")

# Keys whose value asks for something granary does not do: (asks for it, what granary does).
_NO_EQUIVALENT: dict[str, tuple[Callable[[Any], bool], str]] = {
    "generate_padding_batch_train": (
        bool, "the training stream ends when its data does (num_epoch); no padding batches are made"),
    "colocated_python_data_input": (
        bool, "data is loaded in each training process and its worker processes, not in "
              "Pathways colocated Python"),
    "expansion_factor_real_data": (
        lambda v: v != -1, "every process loads its own share of the global batch; to resume "
                           "a state on another host count, use grain_use_elastic_iterator"),
}


@dataclasses.dataclass(frozen=True)
class MaxTextConfig:
    """MaxText's data settings, checked (see the module docstring for the keys).

    Build the pipelines with :func:`dataloader.maxtext.train_dataset`,
    :func:`~dataloader.maxtext.eval_dataset` or
    :func:`~dataloader.maxtext.train_iterator`.

    Attributes:
        other: the keys that are not data keys (``other_keys``, or ignored ones), as given.
    """

    train_files: str | None
    train_mixture: tuple[Component, ...] | None
    eval_files: str | None
    file_type: str
    worker_count: int | str
    worker_count_eval: int | str
    per_worker_buffer_size: int
    per_worker_buffer_size_eval: int
    packing: bool
    packing_type: str
    max_target_length: int
    max_segments_per_seq: int | None
    per_device_batch_size: float
    eval_per_device_batch_size: float
    shuffle: bool
    seed: int
    num_epoch: int | None
    tokenizer_path: str
    tokenizer_type: str
    add_bos: bool
    add_eos: bool
    use_truncation: bool
    tokenize_train_data: bool
    tokenize_eval_data: bool
    train_column: str
    eval_column: str
    record_format: str
    ram_budget_mb: int = 1024
    num_threads: int = 16
    num_threads_eval: int = 16
    prefetch_buffer_size: int = 500
    prefetch_buffer_size_eval: int = 500
    data_source_max_workers: int = 16
    index_storage_option: str | None = None
    shuffle_buffer_size: int = 100
    use_elastic_iterator: bool = False
    other: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def global_batch_size(self, device_count: int, *, eval: bool = False) -> int:
        """``per_device_batch_size`` times the devices, as MaxText's ``global_batch_size_to_load``.

        Raises:
            ConfigError: the product is not a positive whole number.
        """
        key = "eval_per_device_batch_size" if eval and self.eval_per_device_batch_size else "per_device_batch_size"
        per_device = self.eval_per_device_batch_size if key.startswith("eval") else self.per_device_batch_size
        total = per_device * device_count
        if total < 1 or total != int(total):
            raise check.fail(key, f"{per_device} per device times {device_count} devices is {total}, "
                                  f"not a whole number of sequences; choose a value that gives one")
        return int(total)


def _column(key: str, value: Any) -> str:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or len(value) != 1:
        raise check.fail(key, f"expected a list of one column name (pre-training reads one text "
                              f"column), got {value!r}")
    return check.string(f"{key}.0", value[0])


def _batch(key: str, value: Any, zero_ok: bool) -> float:
    number = check.number(key, value)
    if number < 0 or (number == 0 and not zero_ok):
        raise check.fail(key, f"expected a number > 0, got {value!r}")
    return number


def _unknown(data: Mapping[str, Any], other_keys: Iterable[str], ignore_unknown: bool) -> dict[str, Any]:
    """The keys that are not data keys; refuses those that are not expected."""
    allowed = set(other_keys)
    other = {}
    for key, value in data.items():
        if key in DEFAULTS:
            continue
        if key in allowed or (ignore_unknown and not key.startswith("grain_")):
            other[key] = value
            continue
        close = difflib.get_close_matches(key, [*DEFAULTS, *allowed], n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise check.fail(key, f"unknown key{hint} (the data keys are {', '.join(DEFAULTS)})")
    return other


def parse_maxtext_config(
    data: Mapping[str, Any],
    overrides: Iterable[str] = (),
    *,
    other_keys: Iterable[str] = (),
    ignore_unknown: bool = False,
) -> MaxTextConfig:
    """Checks MaxText's data keys given as a dict and applies ``key=value`` overrides.

    Args:
        data: the keys (a parsed MaxText YAML, or a dict written in Python).
        overrides: ``"key=value"`` strings (values read as YAML), MaxText's command line.
        other_keys: keys that are not data keys but belong to the caller (kept in
            ``config.other``).
        ignore_unknown: accept keys that are neither (a whole MaxText config), except
            unknown ``grain_*`` keys.

    Raises:
        ConfigError: naming the key, what was expected and what was found.
    """
    data = check.mapping("config", data)
    data = apply_overrides(data, overrides)
    other = _unknown(data, other_keys, ignore_unknown)
    v = {**DEFAULTS, **{k: data[k] for k in data if k in DEFAULTS}}
    if v["dataset_type"] != "grain":
        raise check.fail("dataset_type", f"expected grain (granary builds MaxText's Grain pipeline), got "
                                         f"{v['dataset_type']!r}; set dataset_type=grain")
    for key in ("use_dpo", "use_sft"):
        if check.boolean(key, v[key]):
            raise check.fail(key, "true, but granary builds MaxText's pre-training pipeline only "
                                  "(no DPO or SFT pipeline); set it to false")
    mixture_path = v["grain_train_mixture_config_path"]
    mixture = load_mixture_config(check.string(KEY_MIXTURE, mixture_path)) if mixture_path else None
    if mixture is None and (v["grain_train_files"] is None or v["grain_train_files"] == ""):
        raise check.fail("grain_train_files", f"missing; this key is required (or {KEY_MIXTURE})")
    if v["tokenizer_path"] is None or v["tokenizer_path"] == "":
        raise check.fail("tokenizer_path", "missing; this key is required")
    if mixture is not None and v["grain_train_files"]:
        logging.info("granary: grain_train_files=%r is not read: %s=%r names the training data, as in "
                     "MaxText", v["grain_train_files"], KEY_MIXTURE, mixture_path)
    eval_files = v["grain_eval_files"]
    if eval_files is not None and eval_files != "":
        check.string("grain_eval_files", eval_files)
    segments = check.integer("max_segments_per_seq", v["max_segments_per_seq"])
    # MaxText's -1 asks for auto-tuning: here worker_count="auto" (the batches do not
    # depend on the count).
    workers = {key: "auto" if v[key] == -1 else check.integer(key, v[key], low=0)
               for key in ("grain_worker_count", "grain_worker_count_eval")}
    file_type = check.string("grain_file_type", v["grain_file_type"], choices=FILE_TYPES)
    record_format = v["record_format"]
    if record_format is None:  # MaxText's TFRecord files hold tf.train.Example records
        record_format = "tf_example" if file_type == "tfrecord" else "text"
    index_option = v["grain_index_storage_option"]
    if index_option is not None:
        check.string("grain_index_storage_option", index_option, choices=INDEX_STORAGE_OPTIONS)
    packing = check.boolean("packing", v["packing"])
    elastic = check.boolean("grain_use_elastic_iterator", v["grain_use_elastic_iterator"])
    if elastic:
        _check_elastic(packing, file_type, mixture is not None or ";" in str(v["grain_train_files"]))
    for key in ("generate_padding_batch_train", "generate_padding_batch_eval", "colocated_python_data_input"):
        check.boolean(key, v[key])
    check.number("expansion_factor_real_data", v["expansion_factor_real_data"])
    for key, (asks, instead) in _NO_EQUIVALENT.items():
        if asks(v[key]):
            logging.info("granary: %s=%r is accepted; %s", key, v[key], instead)
    return MaxTextConfig(
        train_files=None if mixture is not None else check.string("grain_train_files", v["grain_train_files"]),
        train_mixture=mixture,
        eval_files=eval_files or None,
        file_type=file_type,
        worker_count=workers["grain_worker_count"],
        worker_count_eval=workers["grain_worker_count_eval"],
        per_worker_buffer_size=check.integer("grain_per_worker_buffer_size", v["grain_per_worker_buffer_size"], low=1),
        per_worker_buffer_size_eval=check.integer(
            "grain_per_worker_buffer_size_eval", v["grain_per_worker_buffer_size_eval"], low=1),
        packing=packing,
        packing_type=check.string("grain_packing_type", v["grain_packing_type"], choices=PACKING_TYPES),
        max_target_length=check.integer("max_target_length", v["max_target_length"], low=2),
        max_segments_per_seq=segments if segments > 0 else None,
        per_device_batch_size=_batch("per_device_batch_size", v["per_device_batch_size"], zero_ok=False),
        eval_per_device_batch_size=_batch("eval_per_device_batch_size", v["eval_per_device_batch_size"], zero_ok=True),
        shuffle=check.boolean("enable_data_shuffling", v["enable_data_shuffling"]),
        seed=check.integer("data_shuffle_seed", v["data_shuffle_seed"], low=0),
        num_epoch=check.optional_integer("num_epoch", v["num_epoch"], low=1),
        tokenizer_path=os.path.expanduser(check.string("tokenizer_path", v["tokenizer_path"])),
        tokenizer_type=check.string("tokenizer_type", v["tokenizer_type"], choices=TOKENIZER_TYPES),
        add_bos=check.boolean("add_bos", v["add_bos"]),
        add_eos=check.boolean("add_eos", v["add_eos"]),
        use_truncation=check.boolean("use_truncation", v["use_truncation"]),
        tokenize_train_data=check.boolean("tokenize_train_data", v["tokenize_train_data"]),
        tokenize_eval_data=check.boolean("tokenize_eval_data", v["tokenize_eval_data"]),
        train_column=_column("train_data_columns", v["train_data_columns"]),
        eval_column=_column("eval_data_columns", v["eval_data_columns"]),
        record_format=check.string("record_format", record_format, choices=RECORD_FORMATS),
        ram_budget_mb=check.integer("grain_ram_budget_mb", v["grain_ram_budget_mb"], low=1),
        num_threads=check.integer("grain_num_threads", v["grain_num_threads"], low=0),
        num_threads_eval=check.integer("grain_num_threads_eval", v["grain_num_threads_eval"], low=0),
        prefetch_buffer_size=check.integer("grain_prefetch_buffer_size", v["grain_prefetch_buffer_size"], low=0),
        prefetch_buffer_size_eval=check.integer(
            "grain_prefetch_buffer_size_eval", v["grain_prefetch_buffer_size_eval"], low=0),
        data_source_max_workers=check.integer(
            "grain_data_source_max_workers", v["grain_data_source_max_workers"], low=1),
        index_storage_option=index_option,
        shuffle_buffer_size=check.integer("grain_shuffle_buffer_size", v["grain_shuffle_buffer_size"], low=1),
        use_elastic_iterator=elastic,
        other=other,
    )


def _check_elastic(packing: bool, file_type: str, mixture: bool) -> None:
    """grain_use_elastic_iterator reads one indexed dataset, unpacked (as in MaxText)."""
    key = "grain_use_elastic_iterator"
    if packing:
        raise check.fail(key, "true needs packing: false (a packed row's records depend on the "
                              "host count, so its state could not restore on another); set packing=false")
    if file_type == "tfrecord":
        raise check.fail(key, "true needs records read by index (grain_file_type: arrayrecord or "
                              "parquet), got grain_file_type 'tfrecord'")
    if mixture:
        raise check.fail(key, "true reads one file pattern; a mixture (grain_train_files with ';', "
                              "or grain_train_mixture_config_path) cannot be made elastic")


def load_maxtext_config(
    path: str | os.PathLike,
    overrides: Iterable[str] = (),
    *,
    other_keys: Iterable[str] = (),
    ignore_unknown: bool = False,
) -> MaxTextConfig:
    """Reads a MaxText-style YAML file (flat keys) and checks it (see :func:`parse_maxtext_config`).

    ``path`` is a YAML file, or the name of a config shipped with granary (``"maxtext"``,
    ``"lm_demo"``; see :func:`dataloader.config.shipped_config`) when no file of that
    name exists.

    Raises:
        ConfigError: the file is missing or not YAML, or a key is unknown or invalid.
    """
    path = config_file(path)
    data = check.read_yaml_file(path)
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: expected a mapping of MaxText keys, got {data!r}")
    return parse_maxtext_config(data, overrides, other_keys=other_keys, ignore_unknown=ignore_unknown)
