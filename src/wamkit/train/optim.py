"""AdamW with the recipe's parameter groups: action heads get an LR multiplier (x5 in the seeds);
matrices decay, norms/biases/embedding vectors do not; frozen parameters never enter the optimizer."""

from __future__ import annotations

import torch

from wamkit.model.weights import is_action_head_param


def build_optimizer(model: torch.nn.Module, cfg) -> torch.optim.AdamW:
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
    # fused: one kernel per parameter group, no foreach temporaries the size of the trainable state
    return torch.optim.AdamW(param_groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, fused=True)
