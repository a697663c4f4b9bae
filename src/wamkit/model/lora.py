"""LoRA post-training through peft: low-rank adapters on the generation attention projections,
everything else frozen except (optionally) the action pathway, which trains fully.

Order in a run: build the model (`set_trainable`), load base weights into the plain model, then
`prepare_trainable(model, cfg)` once, before the optimizer, EMA and any checkpoint load. The adapters
are ordinary parameters from then on (`...add_q_proj.lora_A.default.weight`, the base weight moves to
`...add_q_proj.base_layer.weight`), so they save and load with the DCP checkpoint like any other.
`merge_lora` folds them back into a plain Cosmos3OmniTransformer state dict for export."""

from __future__ import annotations

import torch

from wamkit.errors import ConfigError
from wamkit.model.cosmos3 import count_parameters
from wamkit.model.weights import ALWAYS_FROZEN, is_action_head_param

DEFAULT_TARGET_MODULES = ("add_q_proj", "add_k_proj", "add_v_proj", "to_add_out")
ADAPTER_NAME = "default"


def _peft():
    try:
        import peft
    except ImportError as exc:  # pragma: no cover - exercised only without the dependency
        raise ImportError("lora.enabled = true needs the `peft` package: pip install 'peft>=0.17'") from exc
    return peft


def is_lora_model(model: torch.nn.Module) -> bool:
    from peft.tuners.lora import LoraLayer

    return any(isinstance(m, LoraLayer) for m in model.modules())


def apply_lora(
    model: torch.nn.Module, rank: int, alpha: float, target_modules=DEFAULT_TARGET_MODULES,
    train_action_pathway: bool = True, dropout: float = 0.0,
) -> dict[str, int]:
    """Inject LoRA adapters into `model` in place and set requires_grad: adapters train, the action
    pathway trains when `train_action_pathway`, everything else is frozen. Returns parameter counts
    (`count_parameters` plus `lora` and `action_pathway`)."""
    peft = _peft()
    if is_lora_model(model):
        raise RuntimeError("the model already carries LoRA adapters: apply_lora must run once per model")
    targets = list(target_modules)
    names = [n for n, _ in model.named_modules()]
    for target in targets:
        if not any(n == target or n.endswith("." + target) for n in names):
            raise ConfigError(
                "lora.target_modules", f"{target!r} matches no module of the model",
                f"use module names such as {list(DEFAULT_TARGET_MODULES)} (the generation attention projections)",
            )
    config = peft.LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, lora_dropout=dropout, bias="none")
    peft.inject_adapter_in_model(config, model, adapter_name=ADAPTER_NAME)
    for name, param in model.named_parameters():
        train = "lora_" in name or (train_action_pathway and is_action_head_param(name))
        param.requires_grad_(train and not any(marker in name for marker in ALWAYS_FROZEN))
    counts = count_parameters(model)
    counts["lora"] = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
    counts["action_pathway"] = sum(p.numel() for n, p in model.named_parameters() if is_action_head_param(n))
    return counts


def prepare_trainable(model: torch.nn.Module, cfg) -> dict[str, int]:
    """The trainer's one call after base weights are loaded and before the optimizer/EMA/resume:
    injects LoRA when `cfg.lora.enabled` (otherwise leaves build_model's `set_trainable` choice) and
    returns the parameter counts."""
    lora = cfg.lora
    if not lora.enabled:
        return count_parameters(model)
    counts = apply_lora(model, lora.rank, lora.alpha, lora.target_modules, lora.train_action_pathway, lora.dropout)
    print(
        f"[wamkit] LoRA rank {lora.rank} alpha {lora.alpha} on {list(lora.target_modules)}"
        f"{' + full action pathway' if lora.train_action_pathway else ''}: "
        f"{counts['trainable']:,} trainable of {counts['total']:,} parameters",
        flush=True,
    )
    return counts


@torch.no_grad()
def merge_lora(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A plain Cosmos3OmniTransformer state dict (base key names, W + scale * B @ A folded in) of a
    LoRA model, without modifying the model. Needs full (unsharded) tensors: call it on a model that
    loaded the checkpoint unsharded (the export path). A model without adapters returns its state dict."""
    from peft.tuners.lora import LoraLayer

    deltas: dict[str, torch.Tensor] = {}
    for name, module in model.named_modules():
        if isinstance(module, LoraLayer):
            if module.merged:
                raise RuntimeError(f"{name}: adapters are already merged into the base weight; merge_lora expects unmerged adapters")
            delta = sum(module.get_delta_weight(a) for a in module.active_adapters if a in module.lora_A)
            deltas[f"{name}.base_layer.weight"] = delta
    merged: dict[str, torch.Tensor] = {}
    for key, value in model.state_dict().items():
        if ".lora_" in key:
            continue
        value = value.detach().clone()
        if key in deltas:
            value = value + deltas[key].to(value.dtype)
        merged[key.replace(".base_layer.", ".")] = value
    return merged
