"""World-model video metrics. Frames are uint8 (or float in [0, 255]) tensors [..., H, W, 3].

psnr            10 log10(255^2 / MSE) per frame (inf for identical frames).
ssim            Wang et al. 2004 with an 11x11 gaussian window (sigma 1.5), C1 = (0.01*255)^2,
                C2 = (0.03*255)^2, 'valid' windows, averaged over pixels and RGB channels.
motion energy   e_t = mean((x_t - x_{t-1})^2) over pixels and channels, t = 1..T.
motion ratio    sum_t e_t(pred) / sum_t e_t(real): 1 = as much motion as the recording, 0 = frozen.
motion corr     Pearson correlation of the per-frame energies e_t(pred) and e_t(real) (None when
                either is constant, e.g. the copy-last-frame baseline).
motion vector   centroid shift of frame differences: D_t = |g_t - g_{t-1}| on the grey image with
                values below `threshold` grey levels set to 0 (codec noise); c_t = D_t-weighted
                centroid (x right, y down, pixels) of every t with any mass; the vector is
                c_last - c_first (0 with fewer than two such frames). A moving blob's difference
                centroid follows the blob, so this is its displacement over the clip.
probe cosine    for action axis a, the predicted response Delta_a = m(+a probe) - m(-a probe) against
                the reference direction d_a: the least-squares fit (with intercept) of the recorded
                chunks' motion vectors on their mean normalized actions, row a. cos(Delta_a, d_a)
                is 1 when the model moves the image the way the data does for that axis; 0 when
                either vector is zero.
axis separation angle between Delta_a and Delta_b (degrees) for every pair of axes; 90 means the
                axes move the image in independent directions, 0/180 that they are confounded.
usable horizon  the time until the per-horizon-step PSNR first falls below a threshold (20 dB by
                default): (h* - 1) / fps seconds for the first failing step h*, or the whole
                horizon when none fails.
real-time factor  generated video seconds / wall seconds."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

MAX = 255.0


def _float(x: torch.Tensor) -> torch.Tensor:
    return x.double()


def psnr(pred: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """Per frame [...]: 10 log10(255^2 / MSE over H, W, 3)."""
    mse = (_float(pred) - _float(real)).pow(2).mean(dim=(-3, -2, -1))
    return 10.0 * torch.log10(MAX**2 / mse)  # mse = 0 -> inf


def gaussian_1d(size: int = 11, sigma: float = 1.5) -> torch.Tensor:
    x = torch.arange(size, dtype=torch.float64) - (size - 1) / 2.0
    g = torch.exp(-(x**2) / (2 * sigma**2))
    return g / g.sum()


def gaussian_window(size: int = 11, sigma: float = 1.5) -> torch.Tensor:
    """The 2-D SSIM window: the outer product of `gaussian_1d` with itself."""
    g = gaussian_1d(size, sigma)
    return g[:, None] * g[None, :]


def ssim(pred: torch.Tensor, real: torch.Tensor, window: int = 11, sigma: float = 1.5) -> torch.Tensor:
    """Per frame [...]: mean SSIM over valid windows and RGB channels. Frames smaller than the
    window use a window of the frame's smaller side. The Gaussian window is separable, so its five
    local statistics are two 1-D convolutions of one stacked batch (the 2-D window's values, up to
    float64 rounding, at ~1/5 of its cost)."""
    shape = pred.shape[:-3]
    h, w = pred.shape[-3], pred.shape[-2]
    size = min(window, h, w)
    x = _float(pred).reshape(-1, h, w, 3).permute(0, 3, 1, 2).reshape(-1, 1, h, w)
    y = _float(real).reshape(-1, h, w, 3).permute(0, 3, 1, 2).reshape(-1, 1, h, w)
    g = gaussian_1d(size, sigma).to(x.device)
    stats = F.conv2d(F.conv2d(torch.cat([x, y, x * x, y * y, x * y]), g.view(1, 1, 1, size)), g.view(1, 1, size, 1))
    mu_x, mu_y, ex2, ey2, exy = stats.split(len(x))
    xx, yy, xy = ex2 - mu_x**2, ey2 - mu_y**2, exy - mu_x * mu_y
    c1, c2 = (0.01 * MAX) ** 2, (0.03 * MAX) ** 2
    s = ((2 * mu_x * mu_y + c1) * (2 * xy + c2)) / ((mu_x**2 + mu_y**2 + c1) * (xx + yy + c2))
    return s.mean(dim=(1, 2, 3)).view(-1, 3).mean(1).reshape(shape)


def motion_energy(video: torch.Tensor) -> torch.Tensor:
    """[..., T+1, H, W, 3] -> [..., T] mean squared frame differences."""
    v = _float(video)
    return (v[..., 1:, :, :, :] - v[..., :-1, :, :, :]).pow(2).mean(dim=(-3, -2, -1))


def motion_ratio(pred: torch.Tensor, real: torch.Tensor) -> float | None:
    real_e = float(motion_energy(real).sum())
    if real_e <= 0:
        return None
    return float(motion_energy(pred).sum()) / real_e


def pearson(a: torch.Tensor, b: torch.Tensor) -> float | None:
    a, b = a.double().flatten(), b.double().flatten()
    a, b = a - a.mean(), b - b.mean()
    den = float(a.norm() * b.norm())
    if den <= 1e-12:
        return None
    return float((a * b).sum()) / den


def motion_correlation(pred: torch.Tensor, real: torch.Tensor) -> float | None:
    return pearson(motion_energy(pred), motion_energy(real))


def motion_vector(video: torch.Tensor, threshold: float = 8.0) -> torch.Tensor:
    """[T+1, H, W, 3] -> [2] (dx, dy) pixels: centroid shift of thresholded frame differences."""
    g = _float(video).mean(-1)  # [T+1, H, W]
    d = (g[1:] - g[:-1]).abs()
    d = torch.where(d >= threshold, d, torch.zeros_like(d))
    mass = d.sum(dim=(1, 2))
    h, w = g.shape[1:]
    ys = torch.arange(h, dtype=torch.float64).view(1, h, 1)
    xs = torch.arange(w, dtype=torch.float64).view(1, 1, w)
    valid = torch.nonzero(mass > 0).flatten()
    if len(valid) < 2:
        return torch.zeros(2, dtype=torch.float64)
    cx = (d * xs).sum(dim=(1, 2)) / mass.clamp_min(1e-12)
    cy = (d * ys).sum(dim=(1, 2)) / mass.clamp_min(1e-12)
    first, last = int(valid[0]), int(valid[-1])
    return torch.stack([cx[last] - cx[first], cy[last] - cy[first]])


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    na, nb = float(a.norm()), float(b.norm())
    if na <= 1e-12 or nb <= 1e-12:
        return 0.0
    return float((a.double() @ b.double()) / (na * nb))


def angle_deg(a: torch.Tensor, b: torch.Tensor) -> float | None:
    if float(a.norm()) <= 1e-12 or float(b.norm()) <= 1e-12:
        return None
    return math.degrees(math.acos(max(-1.0, min(1.0, cosine(a, b)))))


def reference_directions(motions: torch.Tensor, mean_actions: torch.Tensor) -> torch.Tensor | None:
    """Least-squares fit motions [N, 2] ~ [mean_actions [N, A], 1] W; returns W[:A] [A, 2] (one image
    direction per action axis), or None with fewer than A + 1 chunks."""
    n, a = mean_actions.shape
    if n < a + 1:
        return None
    x = torch.cat([mean_actions.double(), torch.ones(n, 1, dtype=torch.float64)], dim=1)
    w = torch.linalg.lstsq(x, motions.double()).solution
    return w[:a]


def probe_metrics(probe_motion: dict[int, dict[str, torch.Tensor]], reference: torch.Tensor | None) -> dict:
    """probe_motion[axis]['+' | '-'] = motion vector. Returns per-axis cosines and pairwise angles."""
    axes = sorted(probe_motion)
    deltas = {a: probe_motion[a]["+"] - probe_motion[a]["-"] for a in axes}
    per_axis = {}
    for a in axes:
        per_axis[str(a)] = {
            "motion_plus": [float(v) for v in probe_motion[a]["+"]],
            "motion_minus": [float(v) for v in probe_motion[a]["-"]],
            "response": [float(v) for v in deltas[a]],
            "antisymmetry_cosine": cosine(probe_motion[a]["+"], probe_motion[a]["-"]),
            "reference": None if reference is None else [float(v) for v in reference[a]],
            "cosine": None if reference is None else cosine(deltas[a], reference[a]),
        }
    pairs = {f"{a}-{b}": angle_deg(deltas[a], deltas[b]) for i, a in enumerate(axes) for b in axes[i + 1:]}
    defined = [v for v in pairs.values() if v is not None]
    return {"axes": per_axis, "separation_deg": pairs,
            "min_separation_deg": min((min(v, 180.0 - v) for v in defined), default=None)}


def usable_horizon(psnr_by_step: list[float], fps: float, threshold: float = 20.0) -> dict:
    """psnr_by_step[h-1] is the PSNR at horizon step h (1-based)."""
    for h, value in enumerate(psnr_by_step, start=1):
        if value < threshold:
            return {"frames": h - 1, "seconds": (h - 1) / fps, "reached_end": False, "threshold_db": threshold}
    n = len(psnr_by_step)
    return {"frames": n, "seconds": n / fps, "reached_end": True, "threshold_db": threshold}


def real_time_factor(video_seconds: float, wall_seconds: float) -> float | None:
    return video_seconds / wall_seconds if wall_seconds > 0 else None


def finite(x: float | None) -> float | None:
    """JSON-safe: inf/nan become None (PSNR of identical frames is inf)."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def mean_finite(values, cap: float | None = None) -> float | None:
    """Mean with None/nan dropped; with `cap` (100 dB for PSNR: identical frames are inf) values are
    clipped to it first, else infinite values are dropped too."""
    vals = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    vals = [min(v, cap) for v in vals] if cap is not None else [v for v in vals if math.isfinite(v)]
    return sum(vals) / len(vals) if vals else None
