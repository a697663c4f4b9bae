"""One place for renames: the reference framework's checkpoint names -> diffusers' flat layout.

The reference nests the text model (`model.net.language_model.model.layers.N...`), names the
generation pathway with a `_moe_gen` suffix (`q_proj_moe_gen`, `o_proj_moe_gen`, ...) and calls
the modality projections `vae2llm` / `llm2vae` / `action2llm` / `llm2action`. diffusers flattens
the text model onto the transformer and uses `add_*_proj` / `to_add_out` / `norm_added_*`,
`proj_in` / `proj_out`, `action_proj_in` / `action_proj_out`."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from wamkit.errors import CheckpointError

PREFIXES = ("model.net.", "net.", "model.")
# (pattern, replacement) applied in order to the key with its prefix removed; first match wins
# for the whole-module renames, and the attention renames are anchored on `self_attn.`.
RENAMES: list[tuple[str, str]] = [
    (r"^language_model\.model\.", ""),
    (r"^language_model\.lm_head\.", "lm_head."),
    (r"^vae2llm\.", "proj_in."),
    (r"^llm2vae\.", "proj_out."),
    (r"^action2llm\.", "action_proj_in."),
    (r"^llm2action\.", "action_proj_out."),
    (r"\.self_attn\.(q|k|v)_proj_moe_gen\.", r".self_attn.add_\1_proj."),
    (r"\.self_attn\.o_proj_moe_gen\.", ".self_attn.to_add_out."),
    (r"\.self_attn\.(q|k)_norm_moe_gen\.", r".self_attn.norm_added_\1."),
    (r"\.self_attn\.(q|k|v)_proj\.", r".self_attn.to_\1."),
    (r"\.self_attn\.o_proj\.", ".self_attn.to_out."),
    (r"\.self_attn\.(q|k)_norm\.", r".self_attn.norm_\1."),
]


def is_reference_state_dict(keys) -> bool:
    return any(k.startswith(("model.net.", "net.")) for k in keys)


def reference_to_diffusers_key(key: str) -> str:
    for prefix in PREFIXES:
        if key.startswith(prefix):
            key = key[len(prefix):]
            break
    for pattern, replacement in RENAMES:
        key = re.sub(pattern, replacement, key)
    return key


def convert_reference_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename every key; two source keys landing on one name is an error, never a silent overwrite."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        new = reference_to_diffusers_key(key)
        if new in out:
            raise CheckpointError(key, f"maps to {new!r}, which another key already produced", "the checkpoint has duplicate tensors; re-export it")
        out[new] = value
    return out


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of a .safetensors file or of every .safetensors file in a directory."""
    from safetensors.torch import load_file

    files = [path] if path.is_file() else sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(str(path), "no *.safetensors files found", "point checkpoint.load_path at a diffusers transformer directory or a reference safetensors export")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file)))
    return state
