"""A convolutional stem beside Cosmos3's patch embedding (`model.vision_stem = "conv"`).

Cosmos3 embeds every 2x2 patch of latents with one linear map (`proj_in`): nothing local is computed
before attention, and a model trained from scratch on a few thousand demonstrations has to build its
edge and blob detectors out of attention over patches. Vision transformers learn faster with a few
convolutions in front (Xiao et al. 2021, "Early convolutions help transformers see better"), and the
baselines wamkit is measured against see through CNNs. The stem runs three 3x3 convolutions (GELU) over
each latent frame, patchifies their features as diffusers patchifies latents and adds a learned
projection of them to the patch, before `proj_in`. The projection starts at zero, so the network starts
as plain Cosmos3. Measured (benchmarks/RESULTS.md, twentieth session): on MT10 at the medium preset on one
H200, 0.37 against 0.36 without, side by side (the medium model learns what it gives); on the CPU, the tiny
preset on button-press-topdown alone (1,500 steps, 50 held-out episodes), 21/50 alone, 43/50 with
`frame_positions = "fourier"` alone, 50/50 with both (two training seeds), against 30/50 with neither. An
option, off by default.

`model.vision_stem = "resnet"` puts two residual blocks (GroupNorm, GELU, two 3x3 convolutions each) after the
first convolution: five convolutions and a receptive field of 11 latent positions, nearer the ResNet-18 that
ACT reads its camera with, for the centimetre-level placement a push needs."""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F
from diffusers import Cosmos3OmniTransformer

STEM_CHANNELS = 64
# Tensors each stem saves for the backward pass, STEM_CHANNELS values per latent position each (wamkit.train.memory):
# "conv": three convolutions' outputs and their GELUs; "resnet": the first convolution's two, and per residual
# block two norms, two GELUs, two convolutions and the sum.
STEM_SAVED_TENSORS = {"conv": 6, "resnet": 2 + 2 * 7}
RESIDUAL_BLOCKS = 2


class ResidualBlock(torch.nn.Module):
    """x + conv(gelu(norm(conv(gelu(norm(x)))))): a pre-activation ResNet block at constant width."""

    def __init__(self, channels: int, groups: int = 8):
        super().__init__()
        self.norms = torch.nn.ModuleList([torch.nn.GroupNorm(groups, channels) for _ in range(2)])
        self.convs = torch.nn.ModuleList([torch.nn.Conv2d(channels, channels, 3, padding=1) for _ in range(2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for norm, conv in zip(self.norms, self.convs):
            h = conv(F.gelu(norm(h)))
        return x + h


class ConvStem(torch.nn.Module):
    """Latents [C, T, H, W] -> features [T * Hp * Wp, patch^2 * C] in diffusers' packing order (t, h, w).
    `residual_blocks = 0`: three plain convolutions ("conv"); otherwise one convolution and that many
    residual blocks ("resnet")."""

    def __init__(self, latent_channel: int, patch: int, channels: int = STEM_CHANNELS, residual_blocks: int = 0):
        super().__init__()
        self.patch = patch
        plain = 1 if residual_blocks else 3
        self.convs = torch.nn.ModuleList([torch.nn.Conv2d(latent_channel if i == 0 else channels, channels, 3, padding=1)
                                          for i in range(plain)])
        self.blocks = torch.nn.ModuleList([ResidualBlock(channels) for _ in range(residual_blocks)])
        self.out = torch.nn.Linear(patch * patch * channels, patch * patch * latent_channel, bias=False)
        torch.nn.init.zeros_(self.out.weight)

    def forward(self, latent: torch.Tensor) -> torch.Tensor:
        x = latent.permute(1, 0, 2, 3).to(self.out.weight.dtype)  # the frames as a batch: [T, C, H, W]
        for conv in self.convs:
            x = F.gelu(conv(x))
        for block in self.blocks:
            x = block(x)
        p, (t, c, h, w) = self.patch, x.shape
        x = F.pad(x, (0, -w % p, 0, -h % p))  # diffusers pads latents to whole patches with zeros
        hp, wp = x.shape[-2] // p, x.shape[-1] // p
        x = x.reshape(t, c, hp, p, wp, p).permute(0, 2, 4, 3, 5, 1).reshape(t * hp * wp, p * p * c)
        return self.out(x)


class ConvStemCosmos3(Cosmos3OmniTransformer):
    """Cosmos3OmniTransformer with a convolutional stem added to its vision patches (module docstring)."""

    stem_residual_blocks = 0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.vision_stem = ConvStem(self.config.latent_channel, self.config.latent_patch_size,
                                    residual_blocks=self.stem_residual_blocks)

    # diffusers reads a model's config keys off its __init__ signature (from_config / from_pretrained)
    __init__.__signature__ = inspect.signature(Cosmos3OmniTransformer.__init__)

    def _patchify_and_pack_latents(self, tokens_vision: list[torch.Tensor]):
        packed, shapes = super()._patchify_and_pack_latents(tokens_vision)
        stem = torch.cat([self.vision_stem(latent.squeeze(0)) for latent in tokens_vision])
        return packed + stem.to(packed.dtype), shapes


class ResNetStemCosmos3(ConvStemCosmos3):
    """The same with the residual stem (`model.vision_stem = "resnet"`)."""

    stem_residual_blocks = RESIDUAL_BLOCKS
