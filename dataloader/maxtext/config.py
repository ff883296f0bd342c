"""MaxText's data keys, read and checked: a MaxText user points granary at their settings.

MaxText configures its Grain input pipeline with flat keys in its YAML (``base.yml``)
and ``key=value`` overrides on the command line. These are the keys read here, with
MaxText's defaults:

=============================  ==============  ============================================
key                            default         meaning
=============================  ==============  ============================================
``grain_train_files``          (required)      a path or glob, or a mixture
                                               ``"a*.array_record,0.3;b*.array_record,0.7"``
                                               (MaxText's ``,``; ``:`` works too)
``grain_eval_files``           ``""``          the same, for the eval pipeline (one pass)
``grain_file_type``            ``arrayrecord`` ``arrayrecord`` or ``parquet``
``grain_worker_count``         1               worker processes (``_eval`` for eval; -1: ``"auto"``)
``grain_per_worker_buffer_size``  1            work units in flight per worker
``grain_packing_type``         ``first_fit``   ``first_fit``, ``best_fit``, ``concat_then_split``
``packing``                    true            pack sequences into rows (else pad each)
``max_target_length``          2048            the row length
``max_segments_per_seq``       -1              most sequences per row (first-fit; -1: any)
``per_device_batch_size``      12.0            times the device count: the global batch
``eval_per_device_batch_size`` 0.0             0: as ``per_device_batch_size``
``enable_data_shuffling``      true            global shuffle of the records
``data_shuffle_seed``          0
``num_epoch``                  1               passes over the training data (null: for ever)
``tokenizer_path``             (required)      see :class:`~dataloader.operations.Tokenize`
``tokenizer_type``             ``sentencepiece``  ``sentencepiece``, ``huggingface``, ``tiktoken``
``add_bos``, ``add_eos``       true
``use_truncation``             true            trim each text to ``max_target_length`` tokens
``tokenize_train_data``        true            false: the column holds token ids already
``tokenize_eval_data``         true
``train_data_columns``         ``['text']``    the record's text column (one)
``eval_data_columns``          ``['text']``
``dataset_type``               ``grain``       must be ``grain`` when given
``record_format``              ``text``        granary's own: ArrayRecord records as UTF-8
                                               ``text``, ``json`` objects, or
                                               ``tf_example`` (serialized ``tf.train.Example``,
                                               what MaxText's own data sets hold)
=============================  ==============  ============================================

Any other key is an error naming it (with the nearest known key), unless the caller
lists it in ``other_keys`` (a training program's own keys: steps, model sizes) or passes
``ignore_unknown=True`` to read a whole MaxText config, in which case only unknown keys
that start with ``grain_`` are refused.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from dataloader.config import checks as check
from dataloader.config.overrides import apply_overrides
from dataloader.errors import ConfigError

DEFAULTS: dict[str, Any] = {
    "grain_train_files": None,
    "grain_eval_files": "",
    "grain_file_type": "arrayrecord",
    "grain_worker_count": 1,
    "grain_worker_count_eval": 1,
    "grain_per_worker_buffer_size": 1,
    "grain_per_worker_buffer_size_eval": 1,
    "grain_packing_type": "first_fit",
    "packing": True,
    "max_target_length": 2048,
    "max_segments_per_seq": -1,
    "per_device_batch_size": 12.0,
    "eval_per_device_batch_size": 0.0,
    "enable_data_shuffling": True,
    "data_shuffle_seed": 0,
    "num_epoch": 1,
    "tokenizer_path": None,
    "tokenizer_type": "sentencepiece",
    "add_bos": True,
    "add_eos": True,
    "use_truncation": True,
    "tokenize_train_data": True,
    "tokenize_eval_data": True,
    "train_data_columns": ["text"],
    "eval_data_columns": ["text"],
    "dataset_type": "grain",
    "record_format": "text",
}
FILE_TYPES = ("arrayrecord", "parquet")
PACKING_TYPES = ("first_fit", "best_fit", "concat_then_split")
TOKENIZER_TYPES = ("sentencepiece", "huggingface", "tiktoken")
RECORD_FORMATS = ("text", "json", "tf_example")


@dataclasses.dataclass(frozen=True)
class MaxTextConfig:
    """MaxText's data settings, checked (see the module docstring for the keys).

    Build the pipelines with :func:`dataloader.maxtext.train_dataset`,
    :func:`~dataloader.maxtext.eval_dataset` or
    :func:`~dataloader.maxtext.train_iterator`.

    Attributes:
        other: the keys that are not data keys (``other_keys``, or ignored ones), as given.
    """

    train_files: str
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
    check.string("dataset_type", v["dataset_type"], choices=("grain",))
    for key in ("grain_train_files", "tokenizer_path"):
        if v[key] is None or v[key] == "":
            raise check.fail(key, "missing; this key is required")
    eval_files = v["grain_eval_files"]
    if eval_files is not None and eval_files != "":
        check.string("grain_eval_files", eval_files)
    segments = check.integer("max_segments_per_seq", v["max_segments_per_seq"])
    # MaxText's -1 asks for auto-tuning: here worker_count="auto" (the batches do not
    # depend on the count).
    workers = {key: "auto" if v[key] == -1 else check.integer(key, v[key], low=0)
               for key in ("grain_worker_count", "grain_worker_count_eval")}
    return MaxTextConfig(
        train_files=check.string("grain_train_files", v["grain_train_files"]),
        eval_files=eval_files or None,
        file_type=check.string("grain_file_type", v["grain_file_type"], choices=FILE_TYPES),
        worker_count=workers["grain_worker_count"],
        worker_count_eval=workers["grain_worker_count_eval"],
        per_worker_buffer_size=check.integer("grain_per_worker_buffer_size", v["grain_per_worker_buffer_size"], low=1),
        per_worker_buffer_size_eval=check.integer(
            "grain_per_worker_buffer_size_eval", v["grain_per_worker_buffer_size_eval"], low=1),
        packing=check.boolean("packing", v["packing"]),
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
        record_format=check.string("record_format", v["record_format"], choices=RECORD_FORMATS),
        other=other,
    )


def load_maxtext_config(
    path: str | os.PathLike,
    overrides: Iterable[str] = (),
    *,
    other_keys: Iterable[str] = (),
    ignore_unknown: bool = False,
) -> MaxTextConfig:
    """Reads a MaxText-style YAML file (flat keys) and checks it (see :func:`parse_maxtext_config`).

    Raises:
        ConfigError: the file is missing or not YAML, or a key is unknown or invalid.
    """
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path!r} does not exist") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: expected a mapping of MaxText keys, got {data!r}")
    return parse_maxtext_config(data, overrides, other_keys=other_keys, ignore_unknown=ignore_unknown)
