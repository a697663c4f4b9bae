"""The optimizer step, gradient clipping and the EMA on each rank's local shards instead of FSDP2's DTensors.

All three are elementwise over the parameters (clipping's norm aside), so a rank can do them on the plain
tensors under its DTensors. Doing them on DTensors sends each foreach kernel through DTensor's dispatch, which
checks every tensor's sharding on the host: on one H200 the MT10 policy's synchronised step spent 18 ms in
clipping and AdamW and 6 ms in the EMA (of 193 ms; benchmarks/RESULTS.md, forty-fourth session) for kernels
that take well under a millisecond. The math is torch's own: the same `adam` function AdamW calls, the
same clipping formula; only the global gradient norm needs the other ranks (one all-reduce of a scalar).
Parameters and optimizer state stay DTensors, so checkpoints (DCP) see no difference."""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.placement_types import Partial, Replicate
from torch.optim.adam import adam


def local(tensor: torch.Tensor) -> torch.Tensor:
    """The rank's own values of a DTensor (its storage: in-place updates reach the DTensor), else the tensor.
    Call under no_grad, where DTensor.to_local is a plain attribute read."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def locals_of(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return [local(t) for t in tensors]


@torch.no_grad()
def clip_grad_norm_(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_ (L2 norm over every gradient, scaled by min(1, max_norm / (norm + 1e-6)))
    on the local shards; returns the global norm as a plain fp32 scalar on the parameters' device. The squared
    local norms are summed over the mesh dimensions the gradients are sharded on (FSDP2's Shard(0)), not over
    those they are replicated on (HSDP's replicas hold the same reduced gradient)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    specs = {(g.device_mesh, tuple(g.placements)) for g in grads if isinstance(g, DTensor)}
    if len(specs) > 1 or (specs and not all(isinstance(g, DTensor) for g in grads)):
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)  # mixed layouts: torch's own path
        return norm.full_tensor() if isinstance(norm, DTensor) else norm
    plain = locals_of(grads)
    squares = torch.stack([n.float() for n in torch._foreach_norm(plain)]).square().sum()
    mesh, placements = next(iter(specs)) if specs else (None, ())
    if mesh is not None and mesh.size() > 1:  # one rank holds the whole norm already
        summed = [Partial() if placement.is_shard() else Replicate() for placement in placements]
        squares = DTensor.from_local(squares, mesh, summed, run_check=False).full_tensor()
    total = squares.sqrt()
    scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    torch._foreach_mul_(plain, scale.to(plain[0].dtype))
    return total


class LocalShardAdamW(torch.optim.AdamW):
    """torch's AdamW whose step hands `torch.optim.adam.adam` the local tensors of the parameters, gradients and
    moments (module docstring). Its state is created, stored and saved as torch's AdamW does it."""

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise ValueError("LocalShardAdamW.step takes no closure (wamkit's trainer computes the loss before it)")
        for group in self.param_groups:
            params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps = [], [], [], [], [], []
            has_complex = self._init_group(group, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps)
            beta1, beta2 = group["betas"]
            adam(locals_of(params), locals_of(grads), locals_of(exp_avgs), locals_of(exp_avg_sqs),
                 locals_of(max_exp_avg_sqs), steps, amsgrad=group["amsgrad"], has_complex=has_complex, beta1=beta1,
                 beta2=beta2, lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"],
                 maximize=group["maximize"], foreach=group["foreach"], capturable=group["capturable"],
                 differentiable=group["differentiable"], fused=group["fused"], grad_scale=None, found_inf=None,
                 decoupled_weight_decay=group["decoupled_weight_decay"])
        return None
