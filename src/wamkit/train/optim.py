"""AdamW with the recipe's parameter groups: action heads get an LR multiplier (x5 in the seeds);
matrices decay, norms/biases/embedding vectors do not; frozen parameters never enter the optimizer.
`optimizer.kind` picks torch's fused AdamW (fp32 moments) or torchao's AdamW8bit (block-wise 8-bit
moments: 2 instead of 8 bytes per trainable parameter; its state saves and resumes through DCP)."""

from __future__ import annotations

import torch

from wamkit.errors import ConfigError
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
    # fused: one kernel per parameter group, no foreach temporaries the size of the trainable state
    return torch.optim.AdamW(param_groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, fused=True)


def _adamw8bit(param_groups: list[dict], cfg) -> torch.optim.Optimizer:
    try:
        from torchao.optim import AdamW8bit
    except ImportError as exc:
        raise ConfigError("optimizer.kind", f"'adamw8bit' needs torchao ({exc})",
                          'pip install "torchao==0.18.0", or use optimizer.kind = "adamw"') from None
    return AdamW8bit(param_groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps)
