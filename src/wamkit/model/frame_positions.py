"""Where a vision token sits in its frame, written into the token itself (`model.frame_positions`).

Cosmos3 places tokens only through mRoPE, which turns attention scores by the *relative* offset of two
tokens and never enters what a token carries: an action token that attends to the token holding a drawer
handle reads what is there, not where it is. At a small preset the spatial axes also get few and slow
rotary frequencies (rope_theta 5e6: the tiny preset turns one column step by 0.02 rad). A model trained
from scratch on a few thousand demonstrations then has to learn to place objects through attention
patterns alone. With `frame_positions = "fourier"` every patch gets Fourier features of its row and
column, as fractions of its frame (any canvas size maps to [0, 1]), through a learned projection into the
patch space, added before `proj_in`; the projection starts at zero, so the network starts as plain
Cosmos3 and learns how much to use. Measured on MT10 at the medium preset (benchmarks/RESULTS.md, nineteenth
session): 0.39 average success against 0.46 without, side by side. On the CPU, the tiny preset on
button-press-topdown alone (twentieth): 43/50 against 30/50, and in held-out recorded states it follows the
expert's lateral moves 91% of the time against 58%: there it makes the policy see where the button is. Kept
as an option, off by default, until the medium preset shows the same at the recipe's length."""

from __future__ import annotations

import inspect
import math

import torch
from diffusers import Cosmos3OmniTransformer

FREQUENCIES = (1, 2, 4, 8)  # half-periods across the frame: 1 tells halves apart, 8 neighbouring tokens of a 16-wide grid
FEATURES = 4 * len(FREQUENCIES)  # sin and cos, rows and columns


def axis_features(count: int, device: torch.device) -> torch.Tensor:
    """[count, 2 * len(FREQUENCIES)]: sin/cos of pi * f * u at each token's centre u in (0, 1)."""
    centres = (torch.arange(count, device=device, dtype=torch.float32) + 0.5) / count
    angles = math.pi * centres[:, None] * torch.tensor(FREQUENCIES, device=device, dtype=torch.float32)
    return torch.cat([angles.sin(), angles.cos()], dim=1)


def grid_features(shape: tuple[int, int, int], patch: int, device: torch.device) -> torch.Tensor:
    """[T * Hp * Wp, FEATURES] in diffusers' packing order (t, h, w) of one latent of shape (T, H, W)."""
    frames, height, width = shape
    rows, cols = -(-height // patch), -(-width // patch)
    per_frame = torch.cat([axis_features(rows, device)[:, None].expand(rows, cols, -1),
                           axis_features(cols, device)[None].expand(rows, cols, -1)], dim=-1)
    return per_frame.reshape(rows * cols, FEATURES).repeat(frames, 1)


class FramePositionCosmos3(Cosmos3OmniTransformer):
    """Cosmos3OmniTransformer whose vision patches carry their place in the frame (module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.frame_position = torch.nn.Linear(FEATURES, self.config.patch_latent_dim, bias=False)
        torch.nn.init.zeros_(self.frame_position.weight)
        # by (latent shape, device): a dataset has few (frame counts x canvas sizes). Never evicted: a captured
        # CUDA graph (wamkit.model.cuda_graphs) reads these tensors at their addresses on every replay.
        self._features_by_shape: dict[tuple, torch.Tensor] = {}

    # diffusers reads a model's config keys off its __init__ signature (from_config / from_pretrained)
    __init__.__signature__ = inspect.signature(Cosmos3OmniTransformer.__init__)

    def _patchify_and_pack_latents(self, tokens_vision: list[torch.Tensor]):
        packed, shapes = super()._patchify_and_pack_latents(tokens_vision)
        features = torch.cat([self._shape_features(tuple(shape), packed.device) for shape in shapes])
        return packed + self.frame_position(features.to(self.frame_position.weight.dtype)).to(packed.dtype), shapes

    def _shape_features(self, shape: tuple, device: torch.device) -> torch.Tensor:
        key = (shape, str(device))
        if key not in self._features_by_shape:
            self._features_by_shape[key] = grid_features(shape, self.config.latent_patch_size, device)
        return self._features_by_shape[key]

