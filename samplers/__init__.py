"""Samplers: which record comes at which position of the stream, in O(1).

Depends on numpy and the standard library only (JAX is imported lazily by
:class:`ShardByJaxProcess`).

Example:
    >>> from samplers import IndexSampler, ShardOptions
    >>> sampler = IndexSampler(10, ShardOptions(shard_index=1, shard_count=2), num_epochs=1)
    >>> sampler.record_keys([0, 1, 2]).tolist()
    [1, 3, 5]
"""

from __future__ import annotations

from .index_sampler import IndexSampler, SequentialSampler
from .metadata import RecordMetadata, RecordRngFactory, record_rng
from .permutation import permute
from .protocol import Sampler
from .sharding import NoSharding, ShardByJaxProcess, ShardOptions

__all__ = [
    "IndexSampler",
    "NoSharding",
    "RecordMetadata",
    "RecordRngFactory",
    "Sampler",
    "SequentialSampler",
    "ShardByJaxProcess",
    "ShardOptions",
    "permute",
    "record_rng",
]

if __name__ != "dataloader.samplers":  # pragma: no cover - a wrong sys.path, not a user error
    raise ImportError(
        f"this folder is installed as dataloader.samplers, but it was imported as {__name__!r}; "
        f"import dataloader.samplers (install the project with pip install -e . to develop it)"
    )
