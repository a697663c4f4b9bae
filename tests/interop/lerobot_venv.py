"""Build (once) and locate the separate LeRobot virtualenv used by the interop test and the benchmark.

LeRobot's standalone dataset package (`lerobot-dataset==0.4.4`) pins huggingface-hub<0.36, so it
cannot share wamkit's venv. It lives in `<repo>/.cache/lerobot-venv` (a `.cache/.gitignore` with `*`
keeps it out of git). Extra pieces it needs on a CPU machine:

* torch==2.13.0 (the local CPU wheel, installed first so pip does not pull a CUDA build);
* torchvision (imported by LeRobot for transforms; its PyPI wheel is CUDA-linked, so lerobot_writer.py
  declares the two ops its import registers);
* torchcodec==0.11.1, LeRobot's default decoder (the last CPU-only PyPI wheel that loads with torch
  2.13; newer ones link CUDA), which needs the system FFmpeg shared libraries (Debian: `ffmpeg`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("WAMKIT_LEROBOT_VENV", ROOT / ".cache" / "lerobot-venv"))
WRITER = Path(__file__).resolve().parent / "lerobot_writer.py"
PACKAGES = (["torch==2.13.0"], ["lerobot-dataset==0.4.4", "torchvision==0.28.0", "torchcodec==0.11.1"])
PROBE = ("import runpy, sys; sys.argv = ['x']; "
         f"g = runpy.run_path({str(WRITER)!r}, run_name='probe'); "
         "from torchcodec.decoders import VideoDecoder; print('ok')")


class LeRobotVenvError(RuntimeError):
    pass


def python() -> Path:
    return VENV / "bin" / "python"


def _run(cmd: list[str], what: str, timeout: float = 1200) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode:
        raise LeRobotVenvError(f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}\n"
                               f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout


def usable() -> bool:
    if not python().exists():
        return False
    proc = subprocess.run([str(python()), "-c", PROBE], capture_output=True, text=True, timeout=300)
    return proc.returncode == 0 and "ok" in proc.stdout


_checked: list[Path] = []  # venvs this process has seen import LeRobot (a probe costs a LeRobot import, ~10 s)


def ensure() -> Path:
    """Return the venv's python, building the venv first if it is missing or broken (a few minutes)."""
    if python() in _checked or usable():
        _checked.append(python())
        return python()
    t0 = time.time()
    VENV.parent.mkdir(parents=True, exist_ok=True)
    gitignore = VENV.parent / ".gitignore"
    if VENV.parent.name == ".cache" and not gitignore.exists():
        gitignore.write_text("# created by tests/interop: keep the LeRobot interop venv out of git\n*\n")
    if not python().exists():
        _run([sys.executable, "-m", "venv", str(VENV)], "creating the LeRobot venv")
    pip = [str(python()), "-m", "pip", "install", "--quiet"]
    for group in PACKAGES:
        _run(pip + group, f"pip install {' '.join(group)} into {VENV}")
    if not usable():
        proc = subprocess.run([str(python()), "-c", PROBE], capture_output=True, text=True, timeout=300)
        raise LeRobotVenvError(f"{VENV} was built but LeRobot or torchcodec does not import:\n{proc.stderr[-3000:]}\n"
                               "torchcodec needs the system FFmpeg libraries: apt-get install -y ffmpeg")
    print(f"built {VENV} in {time.time() - t0:.0f}s", file=sys.stderr)
    _checked.append(python())
    return python()


def run_writer(*args: str, timeout: float = 900) -> str:
    """Run tests/interop/lerobot_writer.py inside the LeRobot venv; its stdout's last line is JSON."""
    return _run([str(ensure()), str(WRITER), *args], f"lerobot_writer.py {args[0]}", timeout=timeout)


def run_writer_batch(commands: list[list[str]], where: Path, timeout: float = 1800) -> str:
    """Several lerobot_writer.py commands in one process of the LeRobot venv (one LeRobot import)."""
    listing = where / "commands.json"
    listing.write_text(json.dumps(commands))
    return run_writer("batch", str(listing), timeout=timeout)
