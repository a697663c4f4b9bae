"""The benchmark scripts keep working (CPU smoke runs; their numbers are recorded in
benchmarks/RESULTS.md from real runs, never asserted here)."""

import subprocess
import sys

import pytest

from tests.helpers import REPO, load_benchmark_script


def _run(*args):
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_train_throughput_prints_table_and_mfu_line():
    out = _run("benchmarks/train_throughput.py", "--layers", "2", "--width", "tiny", "--device", "cpu",
               "--steps", "1", "--warmup", "0", "--shapes", "tiny", "--attention", "sdpa")
    assert "| tiny smoke shape | diffusers as-is, 1 sample |" in out
    assert out.strip().splitlines()[-1].startswith("mfu_tiny=")


def test_serve_latency_prints_table():
    out = _run("benchmarks/serve_latency.py", "--requests", "2", "--clients", "1,2", "--num-steps", "2", "--warmup", "1")
    assert "| clients | requests | denoising steps | p50 ms/chunk |" in out
    assert len([l for l in out.splitlines() if l.startswith("| 1 |") or l.startswith("| 2 |")]) == 2


def test_vae_encode_prints_a_row_per_variant():
    out = _run("benchmarks/vae_encode.py", "--device", "cpu", "--sizes", "32x48", "--frames", "5", "--batch", "1", "--repeats", "1", "--no-compile")
    rows = [l for l in out.splitlines() if l.startswith("| 32x48 |")]
    cells = [[c.strip() for c in r.strip("|").split("|")] for r in rows]
    assert len(rows) == 3 and all(float(c[4]) > 0 for c in cells)  # ms per clip
    assert float(cells[0][5]) == 0 and all(float(c[5]) < 1e-3 for c in cells)  # the variants encode the same latents


def test_train_e2e_runs_the_tiny_seed_recipe_and_prints_its_split(tmp_path):
    out = _run("benchmarks/train_e2e.py", "--cpu-smoke", "--recipes", "g1_simple", "--steps", "2", "--warmup", "1",
               "--work", str(tmp_path))
    row = next(l for l in out.splitlines() if l.startswith("| g1_simple | 1 | online VAE |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert int(cells[3]) >= 2 and float(cells[5]) > 0  # timed steps, samples/s
    assert out.strip().splitlines()[-1].startswith("e2e_mfu_g1_simple=")


def test_masked_attention_prints_a_row_per_call():
    out = _run("benchmarks/masked_attention.py", "--device", "cpu", "--iters", "1", "--warmup", "0", "--chunks", "2", "--per-chunk", "8")
    rows = [[c.strip() for c in l.strip("|").split("|")] for l in out.splitlines() if l.startswith("| mask") or l.startswith("| no mask")]
    assert [r[0] for r in rows] == ["mask + enable_gqa", "mask, K/V expanded", "no mask, K/V expanded"]
    assert all("MATH" in r[1] and float(r[3]) > 0 for r in rows)  # the reference kernel always accepts; a time each


def test_activation_bytes_prints_a_row_per_mode():
    out = _run("benchmarks/activation_bytes.py", "--modes", "eager", "--preset", "tiny", "--samples", "2")
    row = next(l for l in out.splitlines() if l.startswith("| eager |"))
    tokens, mib, per = (float(c) for c in row.strip("|").split("|")[1:])
    assert tokens > 0 and mib > 0 and per > 4  # more than a layer's input saved per token, layer and hidden unit


def test_step_host_ops_prints_ops_a_sample_by_function():
    out = _run("benchmarks/step_host_ops.py", "--small", "2", "--large", "4")
    assert "| function | top-level ops a sample (batch 2 -> 4) |" in out
    assert "| **all** |" in out and "whole step:" in out


def test_camera_pixels_per_cm_prints_a_row_per_camera_and_the_corner_sees_x():
    out = _run("benchmarks/camera_pixels_per_cm.py", "--tasks", "button-press-topdown-v3", "--placements", "3")
    rows = [[c.strip() for c in l.strip("|").split("|")] for l in out.splitlines() if l.startswith("| ") and "---" not in l][1:]
    assert [r[2] for r in rows] == ["corner", "corner2", "corner3", "topview", "behindGripper", "corner@2x"]
    corner_x = float(rows[0][3].split("/")[0])
    assert 0.2 < corner_x < 0.6  # a 1 cm move along x is about a third of a pixel at 64 px (RESULTS.md, twenty-third)
    assert float(rows[5][3].split("/")[0]) == pytest.approx(2 * corner_x, abs=0.02)  # the zoom doubles it
    topview_z = float(rows[3][3].split("/")[2])
    assert topview_z < corner_x  # looking down, height barely moves the image


@pytest.mark.parametrize("extra", [[], ['model.vision_stem="action_keypoints"']], ids=["plain", "action_keypoints"])
def test_position_probe_reads_a_position_the_state_holds_exactly(tmp_path, extra):
    """The demo's state is (x, y, vx, vy): probed for its own x, y, the hand-state column is exact (a linear map of
    its input), the spread is not, and every source gets a finite error; a run with action keypoints gets their
    column too."""
    from tests.helpers import train_tiny_run

    run = train_tiny_run(tmp_path, "probe", extra=extra)
    data = str(tmp_path / "reach")
    out = _run("benchmarks/position_probe.py", str(run), "--frames", data, "--positions", data, "--targets", "xy=0:2",
               "--test-episodes", "2", "--every", "8", "--alphas", "1e-6,1")
    row = next(l for l in out.splitlines() if l.startswith("| xy |"))
    spread, hand, *others = (float(c.strip().removesuffix(" cm")) for c in row.strip("|").split("|")[1:])
    assert hand < 0.01 * spread and spread > 0
    assert len(others) == 3 + bool(extra) and all(v == v and v >= 0 for v in others)


def test_position_probe_chooses_its_ridge_strength_without_the_held_out_episodes(monkeypatch):
    """A feature that is the target plus small noise wants almost no penalty; features that are pure noise want
    the largest (predict the mean). The choice comes from folds of the fitting episodes alone."""
    import numpy as np

    probe = load_benchmark_script(monkeypatch, "position_probe")
    rng = np.random.default_rng(0)
    ys = [rng.normal(size=(20, 2)) for _ in range(8)]
    exact = [np.concatenate([y + 0.01 * rng.normal(size=y.shape), rng.normal(size=(20, 30))], 1) for y in ys]
    noise = [rng.normal(size=(20, 32)) for _ in ys]
    alphas = [1e-3, 1e5]
    assert probe.chosen_alpha(exact, ys, alphas) == 1e-3
    assert probe.chosen_alpha(noise, ys, alphas) == 1e5
    with pytest.raises(SystemExit, match="at least 2 fitting episodes"):
        probe.chosen_alpha(exact[:1], ys[:1], alphas)
