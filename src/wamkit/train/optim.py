"""AdamW with the recipe's parameter groups: action heads get an LR multiplier (x5 in the seeds);
matrices decay, norms/biases/embedding vectors do not; frozen parameters never enter the optimizer.
`optimizer.kind` picks torch's fused AdamW (fp32 moments) or torchao's AdamW8bit (block-wise 8-bit
moments: 2 instead of 8 bytes per trainable parameter; its state saves and resumes through DCP)."""

from __future__ import annotations

import logging

import torch

from wamkit.errors import ConfigError
from wamkit.train.local_shards import LocalShardAdamW, clip_grad_norm_
from wamkit.model.weights import is_action_head_param


def build_optimizer(model: torch.nn.Module, cfg) -> torch.optim.Optimizer:
    groups: dict[tuple[bool, bool], list[torch.nn.Parameter]] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        key = (is_action_head_param(name), param.ndim >= 2 and "action_proj" not in name)
        groups.setdefault(key, []).append(param)
    param_groups = []
    for (is_action, decays), params in sorted(groups.items()):
        lr = cfg.lr * (cfg.action_head_lr_multiplier if is_action else 1.0)
        param_groups.append({
            "params": params, "lr": lr, "initial_lr": lr,
            "weight_decay": cfg.weight_decay if decays else 0.0,
            "name": f"{'action_head' if is_action else 'backbone'}{'' if decays else '_no_decay'}",
        })
    if getattr(cfg, "kind", "adamw") == "adamw8bit":
        return _adamw8bit(param_groups, cfg)
    # fused: one kernel per parameter group, no foreach temporaries the size of the trainable state; run on the
    # local shards of FSDP2's DTensors (wamkit.train.local_shards: the same math without DTensor's host cost)
    return LocalShardAdamW(param_groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, fused=True)


def clip_gradients(model: torch.nn.Module, max_norm: float) -> torch.Tensor:
    """Clip every trainable parameter's gradient to a global L2 norm of `max_norm` (on the local shards) and return
    that norm as a plain tensor. A parameter unused this step (a head with no noisy action rows or video frames:
    forward / inverse dynamics) gets a zero gradient first, so every trainable parameter has optimizer state and
    a resume stays exact."""
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    return clip_grad_norm_(params, max_norm)


def _adamw8bit(param_groups: list[dict], cfg) -> torch.optim.Optimizer:
    try:
        from torchao.optim import AdamW8bit
    except ImportError as exc:
        raise ConfigError("optimizer.kind", f"'adamw8bit' needs torchao ({exc})",
                          'pip install "torchao==0.18.0", or use optimizer.kind = "adamw"') from None
    _say_uncacheable_once()
    return AdamW8bit(param_groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps)


class _UncacheableStepNote(logging.Filter):
    """torchao compiles AdamW8bit's step once per parameter shape, and inductor's cache cannot pickle
    those graphs' keys: it logs a warning with a traceback for each (13 at Nano width, every launch).
    One line says it instead; the graphs compile as before."""

    said = False

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("Failed to pickle cache key"):
            return True
        if not self.said:
            self.said = True
            logging.getLogger("wamkit").warning(
                "[wamkit] torchao's AdamW8bit step graphs cannot be stored in torch.compile's cache (their key does not "
                "pickle): they compile again at every launch (about 11 s at Nano width); the warnings are left out")
        return False


def _say_uncacheable_once() -> None:
    codecache = logging.getLogger("torch._inductor.codecache")
    if not any(isinstance(f, _UncacheableStepNote) for f in codecache.filters):
        codecache.addFilter(_UncacheableStepNote())
