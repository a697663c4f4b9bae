"""Typed experiment config: one schema, TOML recipes, dotted overrides."""

from wamkit.config.loader import config_from_dict, config_to_dict, format_config, load_experiment
from wamkit.config.schema import ExperimentConfig

__all__ = ["ExperimentConfig", "load_experiment", "format_config", "config_to_dict", "config_from_dict"]
