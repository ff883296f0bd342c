"""MaxText's pre-training input pipeline: its config keys, its batch layout, its eval pass.

``dl.maxtext.load_maxtext_config("configs/maxtext.yaml", ["max_target_length=512"])``
reads MaxText's data keys; :func:`train_dataset` / :func:`eval_dataset` build the
streams (tokenize, pack, batch, MaxText's six arrays) and :func:`train_iterator` puts
the training stream on the devices as global arrays.
"""

from dataloader.maxtext.config import (
    MaxTextConfig,
    load_maxtext_config,
    parse_maxtext_config,
)
from dataloader.maxtext.eval import EvalBatches, padding_batch
from dataloader.maxtext.format import KEYS, MaxTextFormat, PadToLength, maxtext_layout
from dataloader.maxtext.mixture import load_mixture_config, mixture_parts, mixture_weights
from dataloader.maxtext.pipeline import (
    eval_dataset,
    tokenizer,
    train_dataset,
    train_iterator,
)
from dataloader.maxtext.records import encode_example, parse_example

__all__ = [
    "KEYS",
    "EvalBatches",
    "MaxTextConfig",
    "MaxTextFormat",
    "PadToLength",
    "encode_example",
    "eval_dataset",
    "load_maxtext_config",
    "load_mixture_config",
    "maxtext_layout",
    "mixture_parts",
    "mixture_weights",
    "padding_batch",
    "parse_example",
    "parse_maxtext_config",
    "tokenizer",
    "train_dataset",
    "train_iterator",
]
