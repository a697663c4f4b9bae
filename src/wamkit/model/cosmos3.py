"""Build diffusers' Cosmos3OmniTransformer from a preset, load base weights, and split its
parameters into the pathways that post-training treats differently."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from diffusers import Cosmos3OmniTransformer
from diffusers.models.transformers.transformer_cosmos3 import DomainAwareLinear

from wamkit.errors import ConfigError
from wamkit.model.goal_head import is_goal_head_param
from wamkit.model.variants import transformer_class
from wamkit.model.weights import ALWAYS_FROZEN, BaseWeights, is_action_head_param, is_generation_param


@dataclass(frozen=True)
class Preset:
    """Architecture of one model size. Real checkpoints carry their own config.json, which wins."""

    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rope_axes_dim: tuple[int, int, int]


PRESETS: dict[str, Preset] = {
    # CPU-sized; rope_axes_dim must sum to head_dim / 2.
    "tiny": Preset(2, 64, 4, 2, 16, 128, 384, (4, 2, 2)),
    "small": Preset(4, 256, 4, 2, 64, 512, 384, (12, 10, 10)),
    # One GPU, minutes: the Meta-World world model of recipes/metaworld_fd.toml.
    "medium": Preset(8, 512, 8, 4, 64, 1536, 384, (12, 10, 10)),
    # Cosmos3-Nano (15.2 B parameters with both pathways).
    "nano": Preset(36, 4096, 32, 8, 128, 12288, 151936, (24, 20, 20)),
}
UNPUBLISHED_PRESETS = ("edge", "super")


def build_transformer(preset: str, latent_channel: int, max_action_dim: int, num_domains: int,
                      fps_modulation: bool = True, frame_positions: str = "none", vision_stem: str = "none") -> Cosmos3OmniTransformer:
    """A randomly initialised transformer of a preset's shape with the action pathway enabled (and, with
    `frame_positions = "fourier"`, vision tokens that carry their place in the frame: wamkit.model.frame_positions;
    with `vision_stem = "conv"`, convolutions beside the patch embedding: wamkit.model.vision_stem)."""
    if preset in UNPUBLISHED_PRESETS:
        raise ConfigError(
            "model.preset",
            f"{preset!r} has no built-in shape table in this version",
            "load the real checkpoint with checkpoint.load_path (its transformer/config.json defines the shape)",
        )
    if preset not in PRESETS:
        raise ConfigError("model.preset", f"unknown preset {preset!r}", f"use one of {sorted(PRESETS)}")
    p = PRESETS[preset]
    model = transformer_class(frame_positions, vision_stem)(
        num_hidden_layers=p.num_hidden_layers,
        hidden_size=p.hidden_size,
        num_attention_heads=p.num_attention_heads,
        num_key_value_heads=p.num_key_value_heads,
        head_dim=p.head_dim,
        intermediate_size=p.intermediate_size,
        vocab_size=p.vocab_size,
        rope_axes_dim=list(p.rope_axes_dim),
        latent_channel=latent_channel,
        patch_latent_dim=latent_channel * 4,
        action_gen=True,
        action_dim=max_action_dim,
        num_embodiment_domains=num_domains,
        enable_fps_modulation=fps_modulation,
    )
    if not any(t.is_meta for t in model.parameters()):
        for domain in range(num_domains):
            init_action_domain(model, domain)
    return host_checked_domain_heads(model)


class HostCheckedDomainLinear(DomainAwareLinear):
    """diffusers' DomainAwareLinear without its device-side domain-id range check: that check reads
    the ids back from the GPU, a host-device sync twice per forward (the action heads in and out),
    and is not allowed inside a CUDA graph capture. wamkit.model.packing checks every sample's id on
    the host before anything reaches the GPU. Same parameters, names and arithmetic (tested)."""

    def forward(self, x: torch.Tensor, domain_id: torch.Tensor) -> torch.Tensor:
        domain_id = domain_id.reshape(-1).to(device=x.device, dtype=torch.long)
        if x.shape[0] != domain_id.shape[0]:
            raise ValueError(f"action tokens ({x.shape[0]}) and domain ids ({domain_id.shape[0]}) differ in number")
        weight = self.fc(domain_id).view(domain_id.shape[0], self.input_size, self.output_size)
        bias = self.bias(domain_id).view(domain_id.shape[0], self.output_size)
        if x.ndim == 2:
            return torch.bmm(x.unsqueeze(1), weight).squeeze(1) + bias
        if x.ndim == 3:
            return torch.bmm(x, weight) + bias.unsqueeze(1)
        raise ValueError(f"action tokens must be rank 2 or 3, got {tuple(x.shape)}")


def host_checked_domain_heads(model):
    """Every DomainAwareLinear of `model` becomes a HostCheckedDomainLinear, in place (before any
    parallel wrapping); returns the model."""
    for module in model.modules():
        if type(module) is DomainAwareLinear:
            module.__class__ = HostCheckedDomainLinear
    return model


def set_trainable(model: torch.nn.Module, train_text_pathway: bool) -> None:
    """Generation pathway and action heads train; the text pathway only when asked; lm_head never."""
    for name, param in model.named_parameters():
        if any(marker in name for marker in ALWAYS_FROZEN):
            param.requires_grad_(False)
        else:
            param.requires_grad_(train_text_pathway or is_generation_param(name))


def count_parameters(model: torch.nn.Module) -> dict[str, int]:
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    generation = sum(p.numel() for n, p in model.named_parameters() if is_generation_param(n))
    return {"total": total, "trainable": trainable, "generation": generation}


def load_pretrained_weights(model: torch.nn.Module, path: Path, fresh_action_domain: int | None, skip_action_heads: bool = False) -> str:
    """Load base weights strictly from a diffusers transformer directory or a reference-framework
    safetensors export (renamed on the way in). A new embodiment starts with a fresh head while
    everything else loads: either one domain's rows are re-initialised (`fresh_action_domain`), or
    the action modules are not loaded at all (`skip_action_heads`, as the seed recipes do; needed
    when the base was trained with another action width). Returns the format."""
    base = BaseWeights(path)
    base.check_matches({k: tuple(v.shape) for k, v in model.state_dict().items()}, skip_action_heads)
    state = {k: base.read(k) for k in base.keys() if not (skip_action_heads and is_action_head_param(k))}
    state.update({k: v for k, v in model.state_dict().items() if is_goal_head_param(k)})  # no base holds it: kept fresh
    model.load_state_dict(state, strict=not skip_action_heads)
    if fresh_action_domain is not None and not skip_action_heads:
        init_action_domain(model, fresh_action_domain)
    return base.kind


@torch.no_grad()
def init_action_domain(model: torch.nn.Module, domain: int) -> None:
    """Give one embodiment domain fresh action-head rows with nn.Linear's fan-in scale.

    diffusers stores each domain's matrix in an nn.Embedding, whose default init is N(0, 1): at
    hidden 4096 that makes a fresh head's outputs ~64x too large and the first steps diverge."""
    for head in (model.action_proj_in, model.action_proj_out):
        bound = 1.0 / head.input_size**0.5
        head.fc.weight[domain].uniform_(-bound, bound)
        head.bias.weight[domain].zero_()
