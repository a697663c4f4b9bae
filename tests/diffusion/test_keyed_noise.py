"""Keyed per-sample noise (the GPU's): standard normal, a function of the sample's seed alone, and the
CPU's own generator streams unchanged."""

import pytest
import torch

from wamkit.diffusion import keyed_noise
from wamkit.diffusion.keyed_noise import ACTION_STREAM, VIDEO_STREAM, keyed_normals, mul32, sample_normals

CPU = torch.device("cpu")


def test_mul32_is_multiplication_modulo_two_to_the_32():
    values = [0, 1, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0xDEADBEEF, 123456789]
    x = torch.tensor(values, dtype=torch.int64)
    for c in (0x85EBCA6B, 0xC2B2AE35, 0xFFFFFFFF, 3):
        assert mul32(x, c).tolist() == [(v * c) & 0xFFFFFFFF for v in values]


def test_the_noise_is_standard_normal():
    z = keyed_normals(list(range(32)), (4, 8, 8, 8), VIDEO_STREAM, CPU).flatten().double()
    assert abs(z.mean().item()) < 0.01 and abs(z.std().item() - 1) < 0.01
    kurtosis = ((z - z.mean()) ** 4).mean() / z.var() ** 2
    assert abs(kurtosis.item() - 3) < 0.05
    for q, expected in ((0.025, -1.96), (0.5, 0.0), (0.975, 1.96)):
        assert abs(torch.quantile(z[:100_000], q).item() - expected) < 0.03
    neighbours = torch.corrcoef(torch.stack([z[:-1], z[1:]]))[0, 1]
    assert abs(neighbours.item()) < 0.01


def test_a_samples_noise_depends_on_its_seed_alone():
    """The same seed gives the same noise in any batch and position (N ranks equal 1 rank, resume is
    exact); other seeds and the other stream give uncorrelated noise."""
    seeds = [11, 2**40 + 5, 7 * 1_000_003 + 3]
    batch = keyed_normals(seeds, (16, 9), ACTION_STREAM, CPU)
    alone = keyed_normals([seeds[1]], (16, 9), ACTION_STREAM, CPU)
    reordered = keyed_normals(seeds[::-1], (16, 9), ACTION_STREAM, CPU)
    assert torch.equal(batch[1], alone[0]) and torch.equal(batch[0], reordered[2])
    corr = lambda a, b: torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1].item()  # noqa: E731
    # neighbouring seeds, seeds one 32-bit half apart, and the two streams of one seed
    a, b, c = keyed_normals([seeds[0], seeds[0] + 1, seeds[0] + (1 << 32)], (50_000,), VIDEO_STREAM, CPU)
    actions = keyed_normals([seeds[0]], (50_000,), ACTION_STREAM, CPU)[0]
    for other in (b, c, actions):
        assert abs(corr(a, other)) < 0.02  # 50,000 pairs: 4.5 standard errors


def test_the_cpu_keeps_each_samples_generator_stream():
    gens = [torch.Generator().manual_seed(s) for s in (3, 4)]
    noise = sample_normals(gens, (2, 5), VIDEO_STREAM, CPU)
    replay = [torch.Generator().manual_seed(s) for s in (3, 4)]
    assert torch.equal(noise, torch.stack([torch.randn((2, 5), generator=g) for g in replay]))
    assert not keyed_noise.use_keyed(CPU) and keyed_noise.use_keyed(torch.device("cuda"))


def test_bad_requests_are_refused():
    with pytest.raises(ValueError, match="stream 2"):
        keyed_normals([1], (3,), 2, CPU)
    with pytest.raises(ValueError, match="2\\*\\*29"):
        keyed_normals([1], (1 << 15, 1 << 14), VIDEO_STREAM, CPU)

