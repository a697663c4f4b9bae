"""World-model metrics against known answers."""

import math

import pytest
import torch

from wamkit.worldmodel import metrics as M


def _image(seed=0, h=32, w=32):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(40, 216, (h, w, 3), generator=g, dtype=torch.uint8)


def test_identical_images_give_infinite_psnr_and_unit_ssim():
    x = _image()
    assert math.isinf(float(M.psnr(x, x)))
    assert float(M.ssim(x, x)) == pytest.approx(1.0, abs=1e-9)


@pytest.mark.parametrize("k", [1, 5, 20])
def test_known_noise_level_gives_analytic_psnr(k):
    x = _image(1)
    sign = (torch.arange(32).view(32, 1, 1) + torch.arange(32).view(1, 32, 1)) % 2 * 2 - 1  # checkerboard +-1
    y = (x.int() + k * sign).to(torch.uint8)  # 40..215 +- 20 never clips: MSE = k^2 exactly
    assert float(M.psnr(y, x)) == pytest.approx(10 * math.log10(255**2 / k**2), abs=1e-9)


def test_ssim_of_constant_images_is_the_luminance_term():
    a, b = 100.0, 140.0
    x = torch.full((20, 20, 3), a)
    y = torch.full((20, 20, 3), b)
    c1 = (0.01 * 255) ** 2
    assert float(M.ssim(x, y)) == pytest.approx((2 * a * b + c1) / (a * a + b * b + c1), abs=1e-9)


def test_ssim_is_symmetric_batched_and_drops_with_noise():
    x = _image(2)
    g = torch.Generator().manual_seed(3)
    small = (x.float() + torch.randn(x.shape, generator=g) * 5).clamp(0, 255)
    large = (x.float() + torch.randn(x.shape, generator=g) * 40).clamp(0, 255)
    s = M.ssim(torch.stack([small, large]), torch.stack([x, x]))
    assert s.shape == (2,) and 1.0 > float(s[0]) > float(s[1]) > 0.0
    assert float(M.ssim(x, small)) == pytest.approx(float(s[0]), abs=1e-12)
    window = M.gaussian_window()
    assert window.shape == (11, 11) and float(window.sum()) == pytest.approx(1.0)


def test_separable_ssim_equals_the_2d_window_definition():
    """SSIM's local statistics from two 1-D convolutions equal those of the 11x11 window (Wang et al.)."""
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(5)
    a, b = (torch.randint(0, 256, (3, 24, 40, 3), generator=g, dtype=torch.uint8) for _ in range(2))
    x, y = (t.double().permute(0, 3, 1, 2).reshape(-1, 1, 24, 40) for t in (a, b))
    k = M.gaussian_window().view(1, 1, 11, 11)
    mu_x, mu_y = F.conv2d(x, k), F.conv2d(y, k)
    xx, yy, xy = F.conv2d(x * x, k) - mu_x**2, F.conv2d(y * y, k) - mu_y**2, F.conv2d(x * y, k) - mu_x * mu_y
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    s = ((2 * mu_x * mu_y + c1) * (2 * xy + c2)) / ((mu_x**2 + mu_y**2 + c1) * (xx + yy + c2))
    expected = s.mean(dim=(1, 2, 3)).view(-1, 3).mean(1)
    torch.testing.assert_close(M.ssim(a, b), expected, rtol=0, atol=1e-12)


def _moving_square(dx, dy, frames=5, size=32):
    video = torch.zeros(frames, size, size, 3, dtype=torch.uint8)
    for t in range(frames):
        x0, y0 = 8 + dx * t, 8 + dy * t
        video[t, y0:y0 + 6, x0:x0 + 6] = 255
    return video


def test_motion_vector_follows_a_moving_square_and_static_video_has_none():
    torch.testing.assert_close(M.motion_vector(_moving_square(2, 0)), torch.tensor([6.0, 0.0], dtype=torch.float64))
    torch.testing.assert_close(M.motion_vector(_moving_square(1, 2)), torch.tensor([3.0, 6.0], dtype=torch.float64))
    still = _moving_square(0, 0)
    torch.testing.assert_close(M.motion_vector(still), torch.zeros(2, dtype=torch.float64))


def test_motion_energy_ratio_and_correlation():
    real = _moving_square(2, 0)
    assert M.motion_ratio(real, real) == pytest.approx(1.0)
    frozen = real[:1].expand_as(real)
    assert M.motion_ratio(frozen, real) == 0.0
    assert M.motion_correlation(frozen, real) is None  # constant energies: undefined
    e = M.motion_energy(real)
    assert e.shape == (4,) and float(e[0]) == pytest.approx(2 * 2 * 6 * 255**2 / (32 * 32))  # 24 changed pixels
    slow = real.clone()
    slow[3:] = slow[2]
    assert M.pearson(torch.tensor([1.0, 2, 3]), torch.tensor([2.0, 4, 6])) == pytest.approx(1.0)
    assert M.motion_correlation(slow, real) is None or M.motion_correlation(slow, real) < 1.0


def test_reference_directions_and_probe_metrics():
    g = torch.Generator().manual_seed(0)
    actions = torch.rand(10, 3, generator=g) * 2 - 1
    w = torch.tensor([[4.0, 0.0], [0.0, 4.0], [0.0, 0.0]], dtype=torch.float64)
    motions = actions.double() @ w + torch.tensor([0.5, -0.5], dtype=torch.float64)
    ref = M.reference_directions(motions, actions)
    torch.testing.assert_close(ref, w, atol=1e-9, rtol=0)
    assert M.reference_directions(motions[:3], actions[:3]) is None
    probes = {0: {"+": torch.tensor([3.0, 0.0]), "-": torch.tensor([-3.0, 0.0])},
              1: {"+": torch.tensor([0.0, 2.0]), "-": torch.tensor([0.0, -2.0])},
              2: {"+": torch.zeros(2), "-": torch.zeros(2)}}
    out = M.probe_metrics(probes, ref)
    assert out["axes"]["0"]["cosine"] == pytest.approx(1.0) and out["axes"]["1"]["cosine"] == pytest.approx(1.0)
    assert out["axes"]["0"]["antisymmetry_cosine"] == pytest.approx(-1.0)
    assert out["axes"]["2"]["cosine"] == 0.0
    assert out["separation_deg"]["0-1"] == pytest.approx(90.0) and out["separation_deg"]["0-2"] is None
    assert out["min_separation_deg"] == pytest.approx(90.0)
    assert M.probe_metrics(probes, None)["axes"]["0"]["cosine"] is None


def test_usable_horizon_and_real_time_factor():
    assert M.usable_horizon([30, 25, 19, 22], fps=10) == {"frames": 2, "seconds": 0.2, "reached_end": False, "threshold_db": 20.0}
    assert M.usable_horizon([30, 25], fps=10, threshold=10)["reached_end"] is True
    assert M.usable_horizon([float("inf"), 15], fps=5)["frames"] == 1
    assert M.real_time_factor(2.0, 4.0) == 0.5 and M.real_time_factor(1.0, 0.0) is None
    assert M.finite(float("inf")) is None and M.mean_finite([float("inf"), 20.0, None], cap=100.0) == 60.0
    assert M.mean_finite([float("inf"), 150.0, None]) == 150.0
