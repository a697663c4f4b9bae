"""Inference: load a trained run (DCP checkpoint or diffusers export) and predict raw action chunks."""

from wamkit.policy.loading import LoadedModel, config_from_dict, load_from_checkpoint, load_from_export, resolve_checkpoint
from wamkit.policy.policy import Policy, load_policy

__all__ = ["LoadedModel", "Policy", "config_from_dict", "load_from_checkpoint", "load_from_export", "load_policy", "resolve_checkpoint"]
