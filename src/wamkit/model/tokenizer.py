"""Video tokenizers (the text tokenizers are in wamkit.model.text_tokenizer). Both video tokenizers
honour one shape contract: T+1 frames become 1 + T/4 latent frames (the first frame alone, then
groups of four), so the sequence builder never needs to know which one is in use."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import torch
import torch.nn.functional as F

from wamkit.errors import ConfigError, DataError
# The text tokenizers live in wamkit.model.text_tokenizer; re-exported here for existing imports.
from wamkit.model.text_tokenizer import ByteTokenizer, PretrainedTextTokenizer, build_text_tokenizer  # noqa: F401

TEMPORAL_FACTOR = 4
PIXEL_TOKENIZERS = ("pixel", "pixel_unshuffle")  # parameter-free: PixelTokenizer, area-pooled or space-to-depth

# The released Wan2.2 VAE's architecture (diffusers AutoencoderKLWan arguments; its latent statistics
# come with the checkpoint). `AutoencoderKLWan(**WAN22_VAE_LAYOUT, latents_mean=..., latents_std=...)`
# builds a randomly initialised stand-in of the real size for benchmarks that cannot download it.
WAN22_VAE_LAYOUT = dict(
    base_dim=160, decoder_base_dim=256, z_dim=48, dim_mult=[1, 2, 4, 4], num_res_blocks=2,
    temperal_downsample=[False, True, True], is_residual=True, in_channels=12, out_channels=12,
    patch_size=2, scale_factor_spatial=16, scale_factor_temporal=4,
)


class VideoTokenizer(Protocol):
    latent_channels: int
    spatial_factor: int
    device: torch.device

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> "VideoTokenizer": ...

    def encode(self, video: torch.Tensor) -> torch.Tensor: ...  # uint8 [B,T+1,H,W,3] -> [B,C,t,h,w]

    def decode(self, latents: torch.Tensor) -> torch.Tensor: ...  # [B,C,t,h,w] -> uint8 [B,T+1,H,W,3]


def latent_channels_for(kind: str, pixel_spatial_factor: int) -> int:
    """Channels of one latent pixel for `model.tokenizer` without loading weights: the Wan2.2 VAE's z
    (48), or what a (weightless) PixelTokenizer of that factor produces."""
    if kind == "wan2.2":
        return 48
    return PixelTokenizer(pixel_spatial_factor, lossless=kind == "pixel_unshuffle").latent_channels


def latent_frames(num_frames: int) -> int:
    if (num_frames - 1) % TEMPORAL_FACTOR:
        raise DataError("video", f"{num_frames} frames is not 1 + 4k", "use chunk_length divisible by 4 (T+1 frames)")
    return 1 + (num_frames - 1) // TEMPORAL_FACTOR


def future_latent_frames(chunk_length: int, future_latents: int = 0, stride: int = 1) -> int:
    """Future latent frames one sample carries beside its actions (`diffusion.future_video_latents` K and
    `diffusion.future_video_stride` S): K, or with K = 0 as many as the chunk holds at that stride, T / (4 S)."""
    return future_latents if future_latents > 0 else chunk_length // (TEMPORAL_FACTOR * stride)


def sample_frame_indices(chunk_length: int, future_latents: int = 0, stride: int = 1) -> list[int] | None:
    """Which of a window's T+1 frames one sample carries: None for all of them; else the observed frame 0 and
    every S-th frame after it, four per future latent frame (K = 1, S = 4, T = 16: frames 0, 4, 8, 12, 16: one
    latent frame that reaches the chunk's end)."""
    if future_latents <= 0 and stride <= 1:
        return None
    k = future_latent_frames(chunk_length, future_latents, stride)
    return list(range(0, TEMPORAL_FACTOR * k * stride + 1, stride))


def _to_unit_range(video: torch.Tensor) -> torch.Tensor:
    """uint8 [B,T,H,W,3] -> float [B,3,T,H,W] in [-1, 1]."""
    return video.permute(0, 4, 1, 2, 3).float().div(127.5).sub(1.0)


def _from_unit_range(video: torch.Tensor) -> torch.Tensor:
    return video.clamp(-1, 1).add(1.0).mul(127.5).round().to(torch.uint8).permute(0, 2, 3, 4, 1)


class PixelTokenizer:
    """Parameter-free tokenizer for models trained from scratch: shrink space by `spatial_factor`,
    then stack each group of four frames into channels (the first frame is repeated to fill its
    group).

    How space shrinks: by area averaging (`lossless=False`, 3 colour channels per latent pixel: a
    goal marker smaller than the factor blurs into its surroundings), or by space-to-depth
    (`lossless=True`, torch's pixel_unshuffle: each latent pixel holds its factor x factor block
    whole, 3 * factor^2 channels). Space-to-depth keeps every pixel at any token grid, so a 4x
    coarser grid (16x fewer tokens) still shows a one-pixel marker; decoding inverts it exactly."""

    def __init__(self, spatial_factor: int = 16, lossless: bool = False):
        self.spatial_factor = spatial_factor
        self.lossless = lossless
        self.pixel_channels = 3 * spatial_factor**2 if lossless else 3
        self.latent_channels = self.pixel_channels * TEMPORAL_FACTOR
        self.device = torch.device("cpu")

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> "PixelTokenizer":
        """Encode on `device` (no weights; `dtype` is ignored: the pooling runs in fp32)."""
        self.device = torch.device(device)
        return self

    def encode(self, video: torch.Tensor) -> torch.Tensor:
        b, n, h, w, _ = video.shape
        _check_divisible(h, w, self.spatial_factor)
        t = latent_frames(n)
        x = _to_unit_range(video.to(self.device, non_blocking=True))  # [B,3,N,H,W]
        x = self._shrink(x)  # [B,c,N,h,w]
        first = x[:, :, :1].expand(-1, -1, TEMPORAL_FACTOR, -1, -1)
        x = torch.cat([first, x[:, :, 1:]], dim=2)  # [B,c,4t,h,w]
        x = x.reshape(b, self.pixel_channels, t, TEMPORAL_FACTOR, *x.shape[-2:])
        return x.permute(0, 3, 1, 2, 4, 5).reshape(b, self.latent_channels, t, *x.shape[-2:])

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        b, _, t, h, w = latents.shape
        x = latents.reshape(b, TEMPORAL_FACTOR, self.pixel_channels, t, h, w).permute(0, 2, 3, 1, 4, 5)
        x = x.reshape(b, self.pixel_channels, t * TEMPORAL_FACTOR, h, w)[:, :, TEMPORAL_FACTOR - 1 :]
        return _from_unit_range(self._grow(x))

    def _shrink(self, x: torch.Tensor) -> torch.Tensor:
        f = self.spatial_factor
        if not self.lossless:
            return F.avg_pool3d(x, kernel_size=(1, f, f))
        frames = F.pixel_unshuffle(x.transpose(1, 2), f)  # [B,N,3f^2,h,w]: pixel_unshuffle takes [..., C, H, W]
        return frames.transpose(1, 2)

    def _grow(self, x: torch.Tensor) -> torch.Tensor:
        f = self.spatial_factor
        if not self.lossless:
            return F.interpolate(x, scale_factor=(1, f, f), mode="nearest")
        return F.pixel_shuffle(x.transpose(1, 2), f).transpose(1, 2)


class WanTokenizer:
    """The Wan2.2 VAE through diffusers' AutoencoderKLWan (z 48, 16x spatial, 4x temporal); latents
    are normalised with the VAE's own latents_mean / latents_std."""

    def __init__(self, vae):
        self.vae = vae.eval().requires_grad_(False)
        single_frame_convs(self.vae)
        cfg = vae.config
        self.latent_channels = int(cfg.z_dim)
        self.spatial_factor = int(cfg.scale_factor_spatial)
        self.mean = torch.tensor(cfg.latents_mean).view(1, -1, 1, 1, 1)
        self.std = torch.tensor(cfg.latents_std).view(1, -1, 1, 1, 1)
        self._graphs = None

    @property
    def device(self) -> torch.device:
        return next(self.vae.parameters()).device

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> "WanTokenizer":
        """Move the VAE (and its latent statistics) to the run's device, in `dtype` when given (bf16
        on GPUs: the encode is a large share of a training step)."""
        self.vae.to(device=device, dtype=dtype) if dtype is not None else self.vae.to(device)
        if torch.device(device).type == "cuda":
            channels_last_convs(self.vae)
        self.mean, self.std = self.mean.to(device), self.std.to(device)
        return self

    def compile_encoder(self, **compile_kwargs) -> None:
        """torch.compile the VAE encoder's chunks after the first frame: its normalisations and
        activations at full resolution fuse: a 33-frame 256x320 clip encodes in 23.0 instead of 38.0
        ms on an H200, a 17-frame 544x736 one in 60.6 instead of 95.2 ms (benchmarks/vae_encode.py,
        benchmarks/RESULTS.md). Training does this on GPUs (model.compile_vae).

        The encoder runs a clip as a first frame, then chunks of four frames, each reading the
        causal cache the previous one left. The first frame (no cache) runs eagerly on its 2-D fast
        path; after it, `uniform_first_frame_cache` gives the cache the shape every later chunk
        leaves and dense inputs the same strides, so all later chunks, the second one included, run
        one compiled graph per batch and frame size, whatever the clip length.
        `compile_seconds` accumulates the time of the calls that compiled (a log line's number)."""
        encoder = self.vae.encoder
        plain, compiled = encoder.forward, torch.compile(encoder.forward, **compile_kwargs)
        calls = [0]  # calls since the cache was cleared (a new clip)
        downsampler_slots = []  # cache entries of the temporal downsamplers (one frame deep throughout)
        self.compile_seconds = 0.0

        def forward(x, feat_cache=None, feat_idx=[0]):  # noqa: B006 - diffusers' own signature
            fresh = feat_cache is None or all(entry is None for entry in feat_cache)  # cleared for a new clip
            calls[0] = 0 if fresh else calls[0] + 1
            if calls[0] == 0:
                out, downsampler_slots[:] = run_noting_downsampler_slots(encoder, plain, x, feat_cache, feat_idx)
                return out
            if calls[0] == 1:
                uniform_first_frame_cache(feat_cache, skip=downsampler_slots)
            # Dense inputs: the graph is guarded on strides, which slices of the clip and the cache
            # entries (eager or compiled views of the last chunk) would otherwise change call to call.
            layout = _activation_format(encoder)
            feat_cache[:] = [_dense(e, layout) if isinstance(e, torch.Tensor) else e for e in feat_cache]
            from wamkit.model.cuda_graphs import dynamo_compile_seconds

            before = dynamo_compile_seconds()
            out = compiled(_dense(x, layout), feat_cache=feat_cache, feat_idx=feat_idx)
            self.compile_seconds += dynamo_compile_seconds() - before
            return out

        encoder.forward = forward

    def enable_cuda_graphs(self) -> None:
        """Replay CUDA encodes from graphs captured per input shape: a policy encodes one frame per
        request, hundreds of small kernels that take longer to launch than to run."""
        from wamkit.model.cuda_graphs import GraphCache

        self._graphs = GraphCache()
        torch.backends.cudnn.benchmark = True  # like the graphs: a one-time cost per shape picks the fastest convolutions

    def disable_cuda_graphs(self) -> None:
        self._graphs = None

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: torch.dtype = torch.float32) -> "WanTokenizer":
        from diffusers import AutoencoderKLWan

        path = Path(path)
        if (path / "vae").is_dir():
            path = path / "vae"
        if not (path / "config.json").is_file():
            raise ConfigError("model.vae_path", f"{path} has no config.json", "point it at a diffusers AutoencoderKLWan directory")
        return cls(AutoencoderKLWan.from_pretrained(str(path), torch_dtype=dtype))

    @torch.no_grad()
    def encode(self, video: torch.Tensor) -> torch.Tensor:
        _check_divisible(video.shape[2], video.shape[3], self.spatial_factor)
        latent_frames(video.shape[1])
        param = next(self.vae.parameters())
        # uint8 crosses to the device (4x fewer bytes than float), and the conversion runs there.
        x = _to_unit_range(video.to(param.device, non_blocking=True)).to(param.dtype)
        if self._graphs is not None and x.is_cuda:
            z = self._graphs.run(("encode", tuple(x.shape), x.dtype), self._encode_mode, [x])
        else:
            z = self._encode_mode([x])
        z = z.float()
        return (z - self.mean.to(z.device)) / self.std.to(z.device)

    def _encode_mode(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        return self.vae.encode(inputs[0]).latent_dist.mode()

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        param = next(self.vae.parameters())
        z = latents * self.std.to(latents.device) + self.mean.to(latents.device)
        x = self.vae.decode(z.to(device=param.device, dtype=param.dtype)).sample.float()
        return _from_unit_range(x)


def uniform_first_frame_cache(feat_cache: list, skip=()) -> None:
    """Prepend a zero frame to the causal convolutions' one-frame cache entries, in place. After the
    first frame each causal convolution caches that one frame and zero-pads the missing second tap
    at the next call; after any later chunk it caches two frames. A zero frame in front is exactly
    that padding, so the results are unchanged and every chunk after the first sees caches of one
    shape: one compiled graph instead of an eager second call (or a second graph). The temporal
    downsamplers' entries (`skip`) stay one frame deep: they keep only the last frame throughout."""
    for i, entry in enumerate(feat_cache):
        if i not in skip and isinstance(entry, torch.Tensor) and entry.dim() == 5 and entry.shape[2] == 1:
            feat_cache[i] = torch.cat([torch.zeros_like(entry), entry], dim=2)


def run_noting_downsampler_slots(encoder, forward, x, feat_cache, feat_idx) -> tuple[torch.Tensor, list[int]]:
    """Run `forward` (the encoder's, eagerly) and note which cache entries its temporal
    downsamplers (diffusers' WanResample in mode downsample3d) take: the cache is one flat list
    filled in call order, so their slots are only known by watching a call."""
    slots = []

    def note(module, args, kwargs):
        slots.append((kwargs["feat_idx"] if "feat_idx" in kwargs else args[2])[0])

    handles = [m.register_forward_pre_hook(note, with_kwargs=True) for m in encoder.modules()
               if type(m).__name__ == "WanResample" and getattr(m, "mode", "") == "downsample3d"]
    try:
        out = forward(x, feat_cache=feat_cache, feat_idx=feat_idx)
    finally:
        for handle in handles:
            handle.remove()
    return out, slots


def _dense(t: torch.Tensor, memory_format: torch.memory_format) -> torch.Tensor:
    """`t` with exactly the strides `memory_format` gives a new tensor of its shape. Compiled graphs
    are guarded on every stride, and `contiguous()` keeps a size-one dimension's stride as it was."""
    canonical = torch.empty(t.shape, device="meta", memory_format=memory_format).stride()
    return t if t.stride() == canonical else t.clone(memory_format=memory_format)


def _activation_format(encoder) -> torch.memory_format:
    """The layout the encoder's activations take: channels-last 3-D where its convolution weights
    are (WanTokenizer.to on CUDA), else row-major."""
    weight = encoder.conv_in.weight
    return torch.channels_last_3d if not weight.is_contiguous() and weight.is_contiguous(memory_format=torch.channels_last_3d) else torch.contiguous_format


def channels_last_convs(vae, memory_format: torch.memory_format = torch.channels_last_3d) -> None:
    """3-D convolution weights in channels-last layout. The clips arrive channels-last already
    ([B,T,H,W,3] permuted), and cuDNN's channels-last 3-D kernels encode 12-15% faster on an H200
    (benchmarks/vae_encode.py, which also passes torch.contiguous_format to undo it)."""
    with torch.no_grad():
        for module in vae.modules():
            if isinstance(module, torch.nn.Conv3d):
                module.weight.data = module.weight.data.contiguous(memory_format=memory_format)


def single_frame_convs(vae) -> int:
    """Run the VAE's causal 3D convolutions as 2D ones on single-frame chunks without a cache (the
    observed frame a policy encodes; the first chunk of every clip). Causal padding puts zeros in
    front of the frame, so every temporal tap but the last multiplies zeros: the result is exactly
    conv2d with the last tap, at a third of the work and on cudnn's faster 2D kernels. Returns the
    number of convolutions given the fast path."""
    patched = 0
    for conv in vae.modules():
        if type(conv).__name__ != "WanCausalConv3d" or getattr(conv, "_single_frame_fast_path", False):
            continue
        if conv.stride[0] != 1 or conv.dilation[0] != 1 or conv._padding[4] != conv.kernel_size[0] - 1:
            continue
        conv.forward = _single_frame_forward(conv, conv.forward)
        conv._single_frame_fast_path = True
        patched += 1
    return patched


def _single_frame_forward(conv, plain):
    pad_w, pad_h = conv._padding[0], conv._padding[2]

    def forward(x, cache_x=None):
        if cache_x is not None or x.shape[2] != 1:
            return plain(x, cache_x)
        out = F.conv2d(x[:, :, 0], conv.weight[:, :, -1], conv.bias, conv.stride[1:], (pad_h, pad_w), conv.dilation[1:])
        return out.unsqueeze(2)

    return forward


def _check_divisible(h: int, w: int, factor: int) -> None:
    if h % factor or w % factor:
        raise DataError("video", f"frame size {h}x{w} is not divisible by the tokenizer's spatial factor {factor}", "resize or pad the camera frames (data layer canvas)")


def build_video_tokenizer(kind: str, vae_path: str = "", pixel_spatial_factor: int = 16,
                          device: torch.device | str = "cpu", dtype: torch.dtype | None = None) -> VideoTokenizer:
    """The run's video tokenizer on the run's device (weights in `dtype` when given)."""
    if kind in PIXEL_TOKENIZERS:
        return PixelTokenizer(pixel_spatial_factor, lossless=kind == "pixel_unshuffle").to(device)
    if kind == "wan2.2":
        return WanTokenizer.from_pretrained(vae_path, dtype or torch.float32).to(device)
    raise ConfigError("model.tokenizer", f"unknown tokenizer {kind!r}", "use 'pixel', 'pixel_unshuffle' or 'wan2.2'")
