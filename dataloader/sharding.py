"""``grain.sharding``' names, so Grain code runs with ``import dataloader as grain``."""

from __future__ import annotations

from dataloader.samplers.sharding import NoSharding, ShardByJaxProcess, ShardOptions

__all__ = ["NoSharding", "ShardByJaxProcess", "ShardOptions"]
