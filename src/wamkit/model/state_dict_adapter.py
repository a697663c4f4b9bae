"""One place for renames: the reference framework's checkpoint names -> diffusers' flat layout.

The reference nests the text model (`model.net.language_model.model.layers.N...`), names the
generation pathway with a `_moe_gen` suffix (`q_proj_moe_gen`, `o_proj_moe_gen`, ...) and calls
the modality projections `vae2llm` / `llm2vae` / `action2llm` / `llm2action`. diffusers flattens
the text model onto the transformer and uses `add_*_proj` / `to_add_out` / `norm_added_*`,
`proj_in` / `proj_out`, `action_proj_in` / `action_proj_out`."""

from __future__ import annotations

import re

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
