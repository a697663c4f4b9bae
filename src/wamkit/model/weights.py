"""What both the eager build (`wamkit.model.cosmos3`) and the sharded fill (`wamkit.model.materialize`) read:
the name markers that split diffusers' Cosmos3 parameters into pathways, and the base checkpoint's tensors
(`BaseWeights`, read lazily by diffusers name)."""

from __future__ import annotations

from pathlib import Path

import torch

from wamkit.errors import CheckpointError
from wamkit.model.goal_head import GOAL_HEAD, is_goal_head_param

# Name fragments of the generation pathway in diffusers' port (everything else is the text pathway).
GENERATION_MARKERS = (
    "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out", "mlp_moe_gen", "_moe_gen", "norm_added_",
    "proj_in", "proj_out", "time_embedder", "action_", "k_norm_und_for_gen", "frame_position",
    "vision_stem",
)
ACTION_HEAD_MARKERS = ("action_proj_in", "action_proj_out", "action_modality_embed", GOAL_HEAD)
ALWAYS_FROZEN = ("lm_head",)  # unused by the diffusion forward; out of the optimizer or DCP loads break


def is_generation_param(name: str) -> bool:
    return any(marker in name for marker in GENERATION_MARKERS)


def is_action_head_param(name: str) -> bool:
    return any(marker in name for marker in ACTION_HEAD_MARKERS)



class BaseWeights:
    """The tensors of a base checkpoint (a diffusers transformer directory or a reference-framework
    safetensors export, renamed on the way in) by diffusers name, read lazily: whole, or as a slice of
    rows, straight from the memory-mapped files."""

    def __init__(self, path: str | Path):
        from safetensors import safe_open

        from wamkit.model.state_dict_adapter import is_reference_state_dict, reference_to_diffusers_key

        path = Path(path)
        if (path / "transformer").is_dir():
            path = path / "transformer"
        files = [path] if path.is_file() else sorted(path.glob("*.safetensors"))
        if not files:
            raise CheckpointError(str(path), "no *.safetensors files found",
                                  "point checkpoint.load_path at a diffusers transformer directory or a reference safetensors export")
        self.path = path
        self._handles = [safe_open(str(f), framework="pt", device="cpu") for f in files]
        source = {key: handle for handle in self._handles for key in handle.keys()}
        self.kind = "diffusers transformer"
        rename = lambda k: k  # noqa: E731
        if is_reference_state_dict(source):
            self.kind, rename = "reference-framework safetensors", reference_to_diffusers_key
        self._index: dict[str, tuple[object, str]] = {}
        for key, handle in source.items():
            new = rename(key)
            if new in self._index:
                raise CheckpointError(key, f"maps to {new!r}, which another key already produced", "the checkpoint has duplicate tensors; re-export it")
            self._index[new] = (handle, key)

    def __contains__(self, name: str) -> bool:
        return name in self._index

    def keys(self):
        return self._index.keys()

    def shape(self, name: str) -> tuple[int, ...]:
        handle, key = self._index[name]
        return tuple(handle.get_slice(key).get_shape())

    def read(self, name: str, rows: slice = slice(None)) -> torch.Tensor:
        handle, key = self._index[name]
        if rows == slice(None):
            return handle.get_tensor(key)
        return handle.get_slice(key)[rows]

    def check_matches(self, expected_shapes: dict[str, tuple[int, ...]], skip_action_heads: bool) -> None:
        """Same keys and shapes as the model (action heads left out when skipped; the training-only goal head,
        which no base holds, always), or a named error."""
        base = {k for k in self._index if not (skip_action_heads and is_action_head_param(k))}
        expected = {k for k in expected_shapes
                    if not (skip_action_heads and is_action_head_param(k)) and not is_goal_head_param(k)}
        missing, unexpected = sorted(expected - base), sorted(base - expected)
        if missing or unexpected:
            raise CheckpointError(
                str(self.path),
                f"keys do not match the model: missing {missing[:20]}{'...' if len(missing) > 20 else ''}, "
                f"unexpected {unexpected[:20]}{'...' if len(unexpected) > 20 else ''}",
                "check model.preset / model.max_action_dim against the checkpoint's config.json",
            )
        for key in sorted(expected):
            if self.shape(key) != tuple(expected_shapes[key]):
                raise CheckpointError(str(self.path), f"{key}: shape {self.shape(key)} != model {tuple(expected_shapes[key])}",
                                      "match the preset to the checkpoint")
