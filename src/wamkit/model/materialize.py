"""Give a transformer built on the meta device its values on the run's device, shard by shard.

At Nano width an eager build is 15 B fp32 parameters initialised on the host (about a minute per
rank, 60 GB of host RAM each) before anything runs. Instead the trainer builds on the meta device,
shards with FSDP2 (still meta), allocates each rank's shards on its GPU (`to_empty`) and fills them
here: every parameter's value is computed on the device, one parameter at a time, and only the rows
this rank holds are kept. Base weights come from the safetensors files as row slices, so a rank reads
only what it holds and host memory stays at one slice, never a full copy.

Random values are a function of (seed, parameter name) alone, so any number of ranks and any
sharding materialise the same model; the distributions are diffusers' own (`nn.Linear`'s kaiming
uniform, `nn.Embedding`'s normal, ones for norms) and wamkit's fresh action-head rule
(`init_action_domain`). A parameter with no rule is an error, never left as uninitialised memory."""

from __future__ import annotations

import math
import zlib

import torch
from diffusers.models.transformers.transformer_cosmos3 import DomainAwareLinear

from wamkit.model.weights import BaseWeights, is_action_head_param

LORA_BASE = ".base_layer"  # peft moves a wrapped layer's own weights under this name


def materialize(model: torch.nn.Module, device: torch.device, seed: int, base: "BaseWeights | None" = None,
                skip_action_heads: bool = False, fresh_action_domain: int | None = None) -> dict[str, int]:
    """Allocate `model` (meta, possibly FSDP2-sharded) on `device` and fill every parameter and buffer.

    With `base`, every parameter the base holds is read from it (action heads excepted when
    `skip_action_heads`; one domain's head rows re-initialised when `fresh_action_domain` is set);
    the rest (LoRA adapters, skipped heads) get their initial values. Returns counts by source."""
    model.to_empty(device=device)
    modules = dict(model.named_modules())
    counts = {"from_base": 0, "initialised": 0}
    if device.type == "meta":  # shapes only (placement checks): there are no values to compute
        return counts
    with torch.no_grad():
        for name, param in model.named_parameters():
            base_name = name.replace(LORA_BASE, "")
            rows = local_rows(param)
            from_base = base is not None and base_name in base and not (skip_action_heads and is_action_head_param(base_name))
            if from_base and fresh_action_domain is not None and is_action_head_param(base_name) and param.ndim == 2:
                value = base.read(base_name).to(device)  # small: every domain's rows of one head
                _fresh_domain_rows(modules, name, value, fresh_action_domain, seed)
                value = value[rows]
            elif from_base:
                value = base.read(base_name, rows)
            else:
                value = initial_value(modules, name, tuple(param.shape), seed, device)[rows]
            counts["from_base" if from_base else "initialised"] += 1
            _local(param).copy_(value.to(device))
        for name, buffer in model.named_buffers():
            buffer.copy_(initial_buffer(modules, name, device))
    return counts


def local_rows(tensor: torch.Tensor) -> slice:
    """The rows of the full tensor that this rank holds: all of them, or its FSDP2 dim-0 shard."""
    if not hasattr(tensor, "device_mesh"):
        return slice(None)
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh, tensor.placements)
    if any(offset[1:]) or tuple(shape[1:]) != tuple(tensor.shape[1:]):
        raise NotImplementedError(f"only dim-0 sharding (FSDP2) is materialised; got placements {tensor.placements}")
    return slice(offset[0], offset[0] + shape[0])


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def parameter_generator(seed: int, name: str, device: torch.device) -> torch.Generator:
    """The random stream of one parameter: independent of ranks, sharding and build order."""
    return torch.Generator(device=device).manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (1 << 63))


def initial_value(modules: dict, name: str, shape: tuple[int, ...], seed: int, device: torch.device) -> torch.Tensor:
    """The full fp32 initial value of parameter `name` of the given shape, computed on `device`."""
    owner_name, _, attr = name.rpartition(".")
    owner = modules[owner_name]
    parent = modules.get(owner_name.rpartition(".")[0]) if owner_name else None
    gen = parameter_generator(seed, name, device)
    kind = type(owner).__name__
    if ".lora_B." in f".{name}" or name.startswith(("frame_position.", "vision_stem.out.", "action_readout_out.")):  # zero updates: peft's adapters,
        return torch.zeros(shape, device=device)  # frame positions, the conv stem's projection
    if isinstance(owner, torch.nn.Conv2d):  # kaiming_uniform(a=sqrt(5)) and its bias rule: U(+-1/sqrt(fan_in))
        fan_in = owner.in_channels // owner.groups * math.prod(owner.kernel_size)
        return _uniform(shape, 1.0 / math.sqrt(fan_in), gen, device)
    if isinstance(owner, torch.nn.Linear):  # kaiming_uniform(a=sqrt(5)) and its bias rule: U(+-1/sqrt(fan_in))
        bound = 1.0 / math.sqrt(owner.in_features) if owner.in_features > 0 else 0.0
        return _uniform(shape, bound, gen, device)
    if isinstance(owner, torch.nn.Embedding) and isinstance(parent, DomainAwareLinear):
        if attr == "weight" and owner is parent.fc:  # cosmos3.init_action_domain: nn.Linear's fan-in scale per domain
            return _uniform(shape, 1.0 / math.sqrt(parent.input_size), gen, device)
        return torch.zeros(shape, device=device)  # per-domain biases start at zero
    if isinstance(owner, torch.nn.Embedding):
        return torch.randn(shape, generator=gen, device=device)
    if "Norm" in kind:
        return torch.ones(shape, device=device) if attr == "weight" else torch.zeros(shape, device=device)
    if attr.endswith("_modality_embed"):
        return torch.zeros(shape, device=device)
    raise NotImplementedError(f"no initialisation rule for parameter {name!r} ({kind}.{attr}); add one to wamkit.model.materialize")


def _uniform(shape, bound: float, gen: torch.Generator, device) -> torch.Tensor:
    return torch.rand(shape, generator=gen, device=device).mul_(2 * bound).sub_(bound)


def _fresh_domain_rows(modules: dict, name: str, value: torch.Tensor, domain: int, seed: int) -> None:
    """A base's action head with one embodiment domain re-initialised, as cosmos3.init_action_domain does."""
    head = modules[name.rsplit(".", 2)[0]]  # the DomainAwareLinear owning `<head>.fc.weight` / `<head>.bias.weight`
    if name.endswith("fc.weight"):
        gen = parameter_generator(seed, f"{name}[{domain}]", value.device)
        value[domain] = _uniform(value.shape[1:], 1.0 / math.sqrt(head.input_size), gen, value.device)
    else:
        value[domain] = 0.0


def initial_buffer(modules: dict, name: str, device: torch.device) -> torch.Tensor:
    """Non-persistent buffers are computed, never loaded: the rotary inverse frequencies."""
    owner_name, _, attr = name.rpartition(".")
    owner = modules[owner_name]
    if attr == "inv_freq":
        rope = modules[""].config
        dim = int(rope.head_dim)
        return 1.0 / (float(rope.rope_theta) ** (torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim))
    raise NotImplementedError(f"no rule for buffer {name!r} of {type(owner).__name__}; add one to wamkit.model.materialize")
