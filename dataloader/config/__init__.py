"""Declarative pipeline configs: YAML files, ``key.sub=value`` overrides, load-time checks."""

from dataloader.config.pipeline import PipelineConfig, load_config, parse_config
from dataloader.config.shipped import shipped_config, shipped_configs

__all__ = ["PipelineConfig", "load_config", "parse_config", "shipped_config", "shipped_configs"]
