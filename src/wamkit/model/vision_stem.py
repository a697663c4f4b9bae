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
ACT reads its camera with, for the centimetre-level placement a push needs.

`model.vision_stem = "action_keypoints"` adds a read-out the action rows see directly: the residual stem's features
of each sample's latest observed frame go through a spatial softmax (Levine et al. 2016; Diffusion Policy's
read-out of its ResNet-18): KEYPOINTS learned maps, each turned into the expected (x, y) of its softmax over the
frame, and a zero-started projection of those coordinates is added to every action row of that sample where it
enters the trunk. A linear probe found the goal marker's position in the frame's tokens and not at the action
head (benchmarks/RESULTS.md, thirty-third session): the rows must otherwise fetch it by attention.

`model.vision_stem = "action_eye"` gives the action rows ACT's eye instead: a ResNet-18 from scratch (GroupNorm;
wamkit.model.resnet) over the pixels of each sample's latest observed frame, its last feature map pooled to 2 x 4
cells and projected (from zero) onto that sample's action rows. On the CPU push testbed (benchmarks/RESULTS.md,
thirty-ninth session, as a patch) it solved 10/80 against the conv stem's 2/80 over two training seeds."""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F
from diffusers import Cosmos3OmniTransformer

from wamkit.model.resnet import WIDTHS, ResNet18
from wamkit.model.tokenizer import TEMPORAL_FACTOR

STEM_CHANNELS = 64
# Tensors each stem saves for the backward pass, STEM_CHANNELS values per latent position each (wamkit.train.memory):
# "conv": three convolutions' outputs and their GELUs; "resnet": the first convolution's two, and per residual
# block two norms, two GELUs, two convolutions and the sum; "action_keypoints" runs the residual stem.
RESIDUAL_BLOCKS = 2
_RESIDUAL_STEM_SAVED = 2 + RESIDUAL_BLOCKS * 7
STEM_SAVED_TENSORS = {"conv": 6, "resnet": _RESIDUAL_STEM_SAVED, "action_keypoints": _RESIDUAL_STEM_SAVED,
                      "action_eye": _RESIDUAL_STEM_SAVED}
# What "action_eye"'s ResNet-18 saves for the backward pass per pixel of each latent frame's image, counted by
# saved-tensor hooks (tests/model/test_vision_stem.py); most of it is the first two stages at 1/2 and 1/4 resolution.
EYE_SAVED_VALUES_PER_PIXEL = 111.0
KEYPOINTS = 32
EYE_GRID = (2, 4)  # "action_eye": ResNet-18's last feature map pooled to 2 x 4 cells (a 64 x 128 frame's whole map)


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


class SpatialSoftmax(torch.nn.Module):
    """Features [N, C, H, W] -> [N, 2K]: for each of K learned maps, the softmax-weighted mean column and row of
    the frame in [-1, 1] (a keypoint's position, differentiable)."""

    def __init__(self, channels: int, keypoints: int = KEYPOINTS):
        super().__init__()
        self.logits = torch.nn.Conv2d(channels, keypoints, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        weights = self.logits(x).flatten(2).float().softmax(-1)  # [N, K, H * W]
        rows = torch.linspace(-1.0, 1.0, h, device=x.device).repeat_interleave(w)
        cols = torch.linspace(-1.0, 1.0, w, device=x.device).repeat(h)
        return torch.cat([weights @ cols, weights @ rows], dim=-1)


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

    def features(self, latent: torch.Tensor) -> torch.Tensor:
        """Latents [C, T, H, W] -> the stem's features [T, channels, H, W]."""
        x = latent.permute(1, 0, 2, 3).to(self.out.weight.dtype)  # the frames as a batch: [T, C, H, W]
        for conv in self.convs:
            x = F.gelu(conv(x))
        for block in self.blocks:
            x = block(x)
        return x

    def forward(self, latent: torch.Tensor) -> torch.Tensor:
        return self.patches(self.features(latent))

    def patches(self, x: torch.Tensor) -> torch.Tensor:
        """Features [T, channels, H, W] -> [T * Hp * Wp, patch^2 * C] through the zero-started projection."""
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
        features = [self.vision_stem.features(latent.squeeze(0)) for latent in tokens_vision]
        self._read_stem_features(features)
        stem = torch.cat([self.vision_stem.patches(x) for x in features])
        return packed + stem.to(packed.dtype), shapes

    def _read_stem_features(self, features: list[torch.Tensor]) -> None:
        """Each vision item's stem features [T, channels, H, W], for subclasses that read more from them."""


class ResNetStemCosmos3(ConvStemCosmos3):
    """The same with the residual stem (`model.vision_stem = "resnet"`)."""

    stem_residual_blocks = RESIDUAL_BLOCKS


def clean_frame_mask(noisy: torch.Tensor, frames: int) -> torch.Tensor:
    """bool [frames]: True where a vision item's frame is clean (observed), given its noisy frames' indexes."""
    return torch.ones(frames, dtype=torch.bool, device=noisy.device).index_fill(0, noisy, False)


def observed_frame_of_rows(noisy: torch.Tensor, frames: int, rows: int) -> torch.Tensor:
    """long [rows]: for each action row of an item of `frames` frames, the last frame of its sample's observed
    (clean) run. A merged item holds its samples one after another, each with the same frame and row counts, so
    row r belongs to the sample whose frames include r * frames // rows; a clean frame maps forward to the end of
    its run, a noisy one back to the run before it. On the device, without a host sync (a captured CUDA graph
    may not sync)."""
    index = torch.arange(frames, device=noisy.device)
    clean = clean_frame_mask(noisy, frames)
    run_end = clean & ~torch.cat([clean[1:], clean.new_zeros(1)])
    last_before = torch.where(run_end, index, 0).cummax(0).values
    next_after = torch.where(run_end, index, frames - 1).flip(0).cummin(0).values.flip(0)
    per_frame = torch.where(clean, next_after, last_before)
    return per_frame[torch.arange(rows, device=noisy.device) * frames // rows]


class ActionReadoutStemCosmos3(ResNetStemCosmos3):
    """The residual stem plus a per-frame read-out of each sample's latest observed frame, added through a
    zero-started projection to that sample's action rows where they enter the trunk. Subclasses set
    `self._readouts` (per vision item, every frame's [T, readout_features]) during each forward."""

    readout_features = 0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.action_readout_out = torch.nn.Linear(self.readout_features, self.config.hidden_size, bias=False)
        torch.nn.init.zeros_(self.action_readout_out.weight)
        self._readouts: list[torch.Tensor] = []
        self._forward_kwargs: dict = {}
        self.action_proj_in.register_forward_hook(self._add_readouts_to_action_rows)

    __init__.__signature__ = inspect.signature(Cosmos3OmniTransformer.__init__)

    def forward(self, *args, **kwargs):
        if args:
            raise TypeError(f"{type(self).__name__} takes the forward's inputs as keywords "
                            "(it reads vision_noisy_frame_indexes and action_token_shapes)")
        self._forward_kwargs = kwargs
        try:
            return super().forward(**kwargs)
        finally:
            self._readouts, self._forward_kwargs = [], {}

    def _add_readouts_to_action_rows(self, module, args, out: torch.Tensor) -> torch.Tensor:
        noisy, shapes = self._forward_kwargs["vision_noisy_frame_indexes"], self._forward_kwargs["action_token_shapes"]
        if len(self._readouts) != len(shapes):
            raise RuntimeError(f"{type(self).__name__}: {len(self._readouts)} vision items against {len(shapes)} "
                               "action items; every policy sample needs both")
        per_row = [readout[observed_frame_of_rows(frames_noisy, readout.shape[0], shape[0])]
                   for readout, frames_noisy, shape in zip(self._readouts, noisy, shapes)]
        added = self.action_readout_out(torch.cat(per_row).to(self.action_readout_out.weight.dtype))
        return out + added.to(out.dtype)


class ActionKeypointStemCosmos3(ActionReadoutStemCosmos3):
    """The read-out is the spatial-softmax keypoints of the residual stem's features
    (`model.vision_stem = "action_keypoints"`, module docstring)."""

    readout_features = 2 * KEYPOINTS

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.action_keypoints = SpatialSoftmax(STEM_CHANNELS, KEYPOINTS)

    __init__.__signature__ = inspect.signature(Cosmos3OmniTransformer.__init__)

    def _read_stem_features(self, features: list[torch.Tensor]) -> None:
        self._readouts = [self.action_keypoints(x) for x in features]


class ActionEyeStemCosmos3(ActionReadoutStemCosmos3):
    """The read-out is a ResNet-18 (wamkit.model.resnet) over the frame's pixels, pooled to an EYE_GRID of
    512-channel cells (`model.vision_stem = "action_eye"`, module docstring). The pixels are the
    pixel_unshuffle tokenizer's latents put back together, so it needs that tokenizer. Only an item's clean
    (observed) frames go through the eye, one of a policy sample's three at MT10's shape."""

    readout_features = WIDTHS[-1] * EYE_GRID[0] * EYE_GRID[1]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.pixel_factor = pixel_unshuffle_factor(self.config.latent_channel)
        self.action_eye = torch.nn.Sequential(ResNet18(), torch.nn.AdaptiveAvgPool2d(EYE_GRID), torch.nn.Flatten())

    __init__.__signature__ = inspect.signature(Cosmos3OmniTransformer.__init__)

    def _patchify_and_pack_latents(self, tokens_vision: list[torch.Tensor]):
        noisy = self._forward_kwargs["vision_noisy_frame_indexes"]
        self._readouts = [self._read_observed_frames(latent.squeeze(0), frames_noisy)
                          for latent, frames_noisy in zip(tokens_vision, noisy)]
        return super()._patchify_and_pack_latents(tokens_vision)

    def _read_observed_frames(self, latent: torch.Tensor, noisy: torch.Tensor) -> torch.Tensor:
        """Every frame's read-out [T, readout_features], the eye run on the clean frames alone. Their count (T less
        the noisy frames') is a shape, so choosing them needs no host sync and a captured CUDA graph keeps it; a
        noisy frame gets the read-out of the clean frame before it, which is what its sample's rows read anyway."""
        frames = latent.shape[1]
        observed = frames - noisy.numel()
        dtype = self.action_readout_out.weight.dtype
        if observed == 0:
            return latent.new_zeros(frames, self.readout_features, dtype=dtype)
        clean = clean_frame_mask(noisy, frames)
        chosen = torch.argsort((~clean).int(), stable=True)[:observed]  # the clean frames, in order
        features = self.action_eye(latest_frame_pixels(latent.index_select(1, chosen), self.pixel_factor).to(dtype))
        return features[(clean.long().cumsum(0) - 1).clamp(min=0)]


def stem_saved_values(kind: str, latent_positions: int, observed_positions: int, pixel_factor: int) -> float:
    """Values a vision stem of `kind` saves for the backward pass for one sample of `latent_positions` latent
    positions, `observed_positions` of them in clean frames (what "action_eye" reads), at a pixel tokenizer's
    spatial factor `pixel_factor` (wamkit.train.memory)."""
    saved = latent_positions * STEM_CHANNELS * STEM_SAVED_TENSORS.get(kind, 0)
    if kind == "action_eye":
        saved += observed_positions * EYE_SAVED_VALUES_PER_PIXEL * pixel_factor**2
    return saved


def pixel_unshuffle_factor(latent_channels: int) -> int:
    """The spatial factor f of a pixel_unshuffle latent of 4 frames x 3 colours x f^2 channels."""
    f = round((latent_channels / (TEMPORAL_FACTOR * 3)) ** 0.5)
    if TEMPORAL_FACTOR * 3 * f * f != latent_channels:
        raise ValueError(f"model.vision_stem = 'action_eye' reads pixels back out of pixel_unshuffle latents "
                         f"(4 x 3 x f^2 channels); {latent_channels} channels are not such a latent: use "
                         "model.tokenizer = 'pixel_unshuffle'")
    return f


def latest_frame_pixels(latent: torch.Tensor, factor: int) -> torch.Tensor:
    """A pixel_unshuffle latent [4 * 3 * f^2, T, h, w] -> the last video frame of each latent frame,
    [T, 3, h * f, w * f] in the tokenizer's [-1, 1] (wamkit.model.tokenizer.PixelTokenizer.encode's inverse)."""
    frames = latent.reshape(TEMPORAL_FACTOR, -1, *latent.shape[1:])[-1].transpose(0, 1)  # [T, 3 f^2, h, w]
    return F.pixel_shuffle(frames, factor)
