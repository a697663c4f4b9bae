"""Turn a validated config into the model and tokenizers a run needs (its data: wamkit.train.datasets). Shared
by training, dry runs, export and serving."""

from __future__ import annotations

from pathlib import Path

import torch

from wamkit.config.env import resolved
from wamkit.errors import ConfigError
from wamkit.train import checkpoint as ckpt
from wamkit.train.base_identity import require_full_weights, saves_trainable_only
from wamkit.model.cosmos3 import build_transformer, load_pretrained_weights, set_trainable
from wamkit.model.goal_head import attach_goal_head
from wamkit.model.text_tokenizer import resolve_text_tokenizer
from wamkit.model.tokenizer import build_video_tokenizer


def build_model(cfg, tokenizer_channels: int, device: torch.device | str = "cpu", meta: bool = False):
    with torch.device("meta" if meta else device):
        model = build_transformer(cfg.model.preset, tokenizer_channels, cfg.model.max_action_dim, cfg.model.num_domains,
                                  cfg.model.fps_modulation, cfg.model.frame_positions, cfg.model.vision_stem)
        if cfg.model.zero_init_video_output:
            zero_video_output(model)
        if cfg.diffusion.goal_state_loss_weight > 0:
            attach_goal_head(model)
    set_trainable(model, cfg.model.train_text_pathway)
    return model


def zero_video_output(model) -> None:
    """model.zero_init_video_output: the video output projection starts at zero."""
    with torch.no_grad():
        model.proj_out.weight.zero_()
        if model.proj_out.bias is not None:
            model.proj_out.bias.zero_()


def base_weights_path(cfg) -> Path:
    return ckpt.load_path_location(resolved(cfg.checkpoint, "load_path"))


def plain_state_dict(model) -> dict:
    """The model's state dict under the plain transformer's names: LoRA adapters left out and peft's
    `.base_layer` removed, so a base or a chain's checkpoint loads into a LoRA-wrapped model."""
    from wamkit.model.materialize import LORA_BASE

    return {k.replace(LORA_BASE, ""): v for k, v in model.state_dict().items() if ".lora_" not in k}


def check_placement(device: torch.device, model, video_tokenizer) -> None:
    """Every parameter and buffer of the transformer and the video tokenizer on the run's device: a
    module left behind (a VAE on the host) would not fail, only crawl."""
    modules = [("transformer", model)]
    if getattr(video_tokenizer, "vae", None) is not None:
        modules.append(("video tokenizer", video_tokenizer.vae))
    for what, module in modules:
        for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
            if tensor.device.type != device.type or (device.index is not None and tensor.device.index != device.index):
                raise RuntimeError(f"{what} {name} is on {tensor.device}, not on the run's device {device}: a wamkit bug, please report it")
    if video_tokenizer.device.type != device.type:
        raise RuntimeError(f"video tokenizer computes on {video_tokenizer.device}, not on {device}: a wamkit bug, please report it")


def load_base_weights(model, cfg) -> str:
    """A fresh run starts from checkpoint.load_path: a wamkit iteration directory loads as it is
    (continuing a chain keeps its action heads); a diffusers base gives this run's domain a fresh
    action head."""
    path = base_weights_path(cfg)
    if (path / ckpt.COMPLETE_MARKER).exists():
        ckpt.verify_checkpoint(path, cfg.checkpoint.verify)  # before its marker is read
        require_full_weights(path, ckpt.read_marker(path), "base of checkpoint.load_path")
        ckpt.load_checkpoint(path, {"model": model.state_dict()}, verify=None)  # verified above
        return "wamkit checkpoint"
    return load_pretrained_weights(model, path, fresh_action_domain=cfg.data.domain_id, skip_action_heads=cfg.checkpoint.skip_action_heads)


def builds_on_meta(cfg, device: torch.device) -> bool:
    """parallel.init: `auto` builds on the meta device and materialises on GPUs (no host init of
    billions of parameters) and for LoRA runs (their frozen weights are rebuilt keyed by name:
    wamkit.train.base_identity), eagerly otherwise on the CPU; `meta` / `eager` force one way."""
    return cfg.parallel.init == "meta" or (cfg.parallel.init == "auto" and (device.type == "cuda" or saves_trainable_only(cfg)))


def materialize_run_model(model, cfg, device: torch.device, load_base: bool) -> str:
    """Values for a meta-built (possibly sharded) model: random, keyed by parameter name, or with
    `load_base` checkpoint.load_path's -- a wamkit iteration directory loaded into the shards, or a
    diffusers base read as row slices per rank. Returns what the run started from."""
    from wamkit.model.materialize import materialize
    from wamkit.model.weights import BaseWeights

    if not load_base or not cfg.checkpoint.load_path:
        materialize(model, device, cfg.job.seed)
        if cfg.model.zero_init_video_output:
            zero_video_output(model)
        return "fresh run from random initialisation"
    path = base_weights_path(cfg)
    if (path / ckpt.COMPLETE_MARKER).exists():  # a wamkit iteration (a chain's previous stage)
        ckpt.verify_checkpoint(path, cfg.checkpoint.verify)  # before its marker is read
        require_full_weights(path, ckpt.read_marker(path), "base of checkpoint.load_path")
        materialize(model, device, cfg.job.seed)
        ckpt.load_checkpoint(path, {"model": plain_state_dict(model)}, verify=None)  # verified above
        return f"fresh run from base weights (wamkit checkpoint) {path}"
    base = BaseWeights(path)
    base.check_matches({k: tuple(v.shape) for k, v in plain_state_dict(model).items()}, cfg.checkpoint.skip_action_heads)
    materialize(model, device, cfg.job.seed, base, skip_action_heads=cfg.checkpoint.skip_action_heads,
                fresh_action_domain=cfg.data.domain_id)
    return f"fresh run from base weights ({base.kind}) {path}"


def build_tokenizers(cfg, device: torch.device | str = "cpu"):
    """(video, text) tokenizers; the video tokenizer computes on `device`, on GPUs in the run's
    compute dtype (parallel.param_dtype)."""
    from wamkit.train.parallel import DTYPES

    dtype = DTYPES[cfg.parallel.param_dtype] if torch.device(device).type == "cuda" else None
    vae_path = resolved(cfg.model, "vae_path") if cfg.model.tokenizer == "wan2.2" else ""
    video = build_video_tokenizer(cfg.model.tokenizer, vae_path, cfg.model.pixel_spatial_factor, device=device, dtype=dtype)
    text = resolve_text_tokenizer(cfg)  # the base checkpoint's own tokenizer (wamkit.model.text_tokenizer)
    return video, text




def check_vocab(model, text_tokenizer) -> None:
    """Every text id must have a row in the model's embedding. (A byte tokenizer beside a pretrained
    base is refused earlier, by resolve_text_tokenizer; bytes into a randomly initialised Nano-sized
    embedding are fine: there is no pretrained vocabulary to mismatch.)"""
    if text_tokenizer.vocab_size > model.config.vocab_size:
        raise ConfigError("model.text_tokenizer_path", f"tokenizer has {text_tokenizer.vocab_size} ids but the model embeds {model.config.vocab_size}", "use the tokenizer shipped with the checkpoint")
