"""Declarative pipeline configs: YAML files, ``key.sub=value`` overrides, load-time checks."""

from dataloader.config.pipeline import PipelineConfig, load_config, parse_config

__all__ = ["PipelineConfig", "load_config", "parse_config"]
