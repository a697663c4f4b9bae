"""The benchmark scripts keep working (CPU smoke runs; their numbers are recorded in
benchmarks/RESULTS.md from real runs, never asserted here)."""

import subprocess
import sys

from tests.helpers import REPO


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
