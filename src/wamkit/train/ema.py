"""Exponential moving average of the trainable weights. beta_t = min(beta, t / (t + warmup)), so at
t = 0 the average is an exact copy and early noise does not linger."""

from __future__ import annotations

import torch

from wamkit.train.local_shards import local


class EMA:
    def __init__(self, model: torch.nn.Module, beta: float, warmup: float):
        self.beta, self.warmup = beta, warmup
        self.shadow = {n: p.detach().clone().float() for n, p in model.named_parameters() if p.requires_grad}

    def beta_at(self, step: int) -> float:
        return min(self.beta, step / (step + self.warmup))

    @torch.no_grad()
    def update(self, model: torch.nn.Module, step: int) -> None:
        """One fused lerp over all averaged weights (torch's foreach kernels) on their local shards: a loop of
        one lerp per tensor launched hundreds of kernels a step, and DTensor's dispatch checked every tensor's
        sharding on the host (wamkit.train.local_shards); the lerp is elementwise, so each rank's shard is enough."""
        beta = self.beta_at(step)
        pairs = [(local(self.shadow[name]), local(param)) for name, param in model.named_parameters() if name in self.shadow]
        if not pairs:
            return
        shadows = [s for s, _ in pairs]
        params = [p if p.dtype == s.dtype else p.to(s.dtype) for s, p in pairs]
        torch._foreach_lerp_(shadows, params, 1.0 - beta)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.shadow

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for name, value in state.items():
            self.shadow[name].copy_(value)

    @torch.no_grad()
    def copy_to(self, model: torch.nn.Module) -> None:
        for name, param in model.named_parameters():
            if name in self.shadow:
                param.copy_(self.shadow[name].to(param.dtype))
