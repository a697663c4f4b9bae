"""A training step's per-sample Gaussian noise, drawn for the whole batch at once on a GPU.

Every sample's noise is a function of its own seed (wamkit.train.trainer.sample_generator: the run's seed and
the sample's global position), so N ranks equal 1 rank and a resume is exact. torch's generators give a
sample its own stream only through one generator object and one `randn` launch per tensor: at the MT10
recipe's batch 256 that was 512 launches and 256 device-generator seedings a step, on a step bound by the
host (benchmarks/RESULTS.md). On a GPU the noise is instead a keyed hash of (the sample's seed, a stream
number, the element's index), three rounds of murmur3's 32-bit finaliser, turned into normals by Box-Muller:
one compiled kernel for the batch. On the CPU each sample still draws from its own generator, as always,
so CPU runs keep the random stream they had."""

from __future__ import annotations

import math

import torch

MASK32 = 0xFFFFFFFF
ROUNDS = 3
VIDEO_STREAM, ACTION_STREAM = 0, 1  # the two kinds of noise a sample draws
STREAMS = 2
MAX_ELEMENTS = 1 << 29  # counters are element * 2 * STREAMS + ...: they must stay below 2**32


def mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for 0 <= x < 2**32 in int64 arithmetic that never overflows: x is split in
    16-bit halves, so no product exceeds 2**48."""
    low, high = x & 0xFFFF, x >> 16
    return (low * c + (((high * c) & 0xFFFF) << 16)) & MASK32


def fmix32(h: torch.Tensor) -> torch.Tensor:
    """murmur3's 32-bit finaliser (a bijection with full avalanche) on int64 values below 2**32."""
    h = h ^ (h >> 16)
    h = mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def seed_keys(seeds: list[int]) -> torch.Tensor:
    """[B, ROUNDS] int64 round keys of 32 bits for 64-bit seeds (both halves of a seed reach every key)."""
    halves = torch.tensor([[s & MASK32, (s >> 32) & MASK32] for s in seeds], dtype=torch.int64).view(-1, 2)
    k1 = fmix32(halves[:, 0] ^ 0x9E3779B9)
    k2 = fmix32(halves[:, 1] ^ k1 ^ 0x7F4A7C15)
    k3 = fmix32(k1 ^ k2 ^ 0x2545F491)
    return torch.stack([k1, k2, k3], dim=1)


def _bits(counters: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """32 random bits per counter and key set: counters [N], keys [B, ROUNDS] -> [B, N]."""
    h = counters.unsqueeze(0)
    for r in range(ROUNDS):
        h = fmix32(h ^ keys[:, r : r + 1])
    return h


def _uniform(bits: torch.Tensor) -> torch.Tensor:
    """Uniform in (0, 1) from the top 24 bits (float32's mantissa): never 0, so the log is finite."""
    return ((bits >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))


def normals_from_keys(keys: torch.Tensor, numel: int, stream: int) -> torch.Tensor:
    """[B, numel] standard normals, row b a function of keys[b], the stream and the element index only."""
    index = torch.arange(numel, device=keys.device, dtype=torch.int64) * (2 * STREAMS) + 2 * stream
    radius = torch.sqrt(-2.0 * torch.log(_uniform(_bits(index, keys))))
    angle = (2.0 * math.pi) * _uniform(_bits(index + 1, keys))
    return radius * torch.cos(angle)


_compiled = None


def _normals_fn(device: torch.device):
    """The compiled generator on CUDA (one fused kernel instead of ~60 elementwise ones); plain elsewhere."""
    global _compiled
    if device.type != "cuda":
        return normals_from_keys
    if _compiled is None:
        _compiled = torch.compile(normals_from_keys, dynamic=None)
    return _compiled


def keyed_normals(seeds: list[int], shape: tuple[int, ...], stream: int, device: torch.device) -> torch.Tensor:
    """[len(seeds), *shape] standard normals: sample b's a function of seeds[b], `stream` and the element alone."""
    numel = math.prod(shape)
    if numel >= MAX_ELEMENTS:
        raise ValueError(f"keyed noise of {numel:,} elements a sample: at most {MAX_ELEMENTS - 1:,} (2**29 - 1)")
    if not 0 <= stream < STREAMS:
        raise ValueError(f"noise stream {stream}: use VIDEO_STREAM (0) or ACTION_STREAM (1)")
    keys = seed_keys(seeds).to(device, non_blocking=True)
    return _normals_fn(torch.device(device))(keys, numel, stream).view(len(seeds), *shape)


def use_keyed(device: torch.device) -> bool:
    """Keyed noise off the CPU: a GPU's per-sample generators cost a launch per tensor."""
    return torch.device(device).type != "cpu"


def sample_normals(generators: list[torch.Generator], shape: tuple[int, ...], stream: int, device: torch.device) -> torch.Tensor:
    """[B, *shape] noise of one kind (`stream`) for B samples: each from its own generator on the CPU, keyed
    by the generators' seeds elsewhere (a pure function of seed, stream and element: see the module)."""
    if use_keyed(device):
        return keyed_normals([g.initial_seed() for g in generators], tuple(shape), stream, device)
    return torch.stack([torch.randn(shape, generator=g) for g in generators]).to(device)
