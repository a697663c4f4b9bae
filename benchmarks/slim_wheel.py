"""Rewrite a wheel with its large PNG textures downscaled, or whole subpackages left out, so Meta-World (35 MB of
textures) and diffusers fit one device carry beside wamkit's wheels (64 MiB in all).

    python benchmarks/slim_wheel.py .whl_sim/metaworld-3.1.1-py3-none-any.whl [--max-side 256] [--min-bytes 200000]
    python benchmarks/slim_wheel.py .whl/diffusers-0.42.1-py3-none-any.whl --drop diffusers/pipelines --drop ...

Cameras render 64-96 px frames, so a 2048 px wood texture is mipmapped down to a few texels anyway;
textures are shrunk by a power of two (grid layouts stay divisible), height maps are left alone (their
size is geometry). Every frame recorded and evaluated on the device then uses the same slim textures;
they differ slightly from a full install's, so record and evaluate with the same install. The
wheel's RECORD gets the new hashes and sizes.

--drop removes a folder of the wheel (diffusers' pipelines: 3.9 of its 5.9 MiB; wamkit uses its models and
schedulers, LeRobot's Diffusion Policy its schedulers, and diffusers imports its subpackages lazily); the
folder's RECORD lines go with it.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import zipfile
from pathlib import Path


def shrink_png(data: bytes, max_side: int) -> bytes | None:
    """The PNG scaled down by the smallest power of two that brings its longer side to <= max_side (None: already small)."""
    from PIL import Image

    image = Image.open(io.BytesIO(data))
    factor = 1
    while max(image.size) / factor > max_side:
        factor *= 2
    if factor == 1:
        return None
    small = image.resize((max(1, image.width // factor), max(1, image.height // factor)), Image.LANCZOS)
    out = io.BytesIO()
    small.save(out, format="PNG", optimize=True)
    return out.getvalue()


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def slim(path: Path, max_side: int, min_bytes: int, drop: tuple[str, ...] = ()) -> tuple[int, int]:
    """Rewrite `path` in place; (bytes before, bytes after)."""
    before = path.stat().st_size
    prefixes = tuple(d.rstrip("/") + "/" for d in drop)
    with zipfile.ZipFile(path) as src:
        names = [i.filename for i in src.infolist()]
        missing = [d for d in prefixes if not any(n.startswith(d) for n in names)]
        if missing:
            raise SystemExit(f"{path.name}: no folder {', '.join(missing)} in the wheel (--drop names a folder inside it)")
        files = {n: src.read(n) for n in names if not n.startswith(prefixes)}
    changed = {}
    for name, data in files.items():
        if name.endswith(".png") and len(data) >= min_bytes and "height" not in Path(name).name:
            small = shrink_png(data, max_side)
            if small is not None:
                changed[name] = small
    files.update(changed)
    record = next(n for n in files if n.endswith(".dist-info/RECORD"))
    lines = [record_line(n, files[n]) if n in changed else line
             for line in files[record].decode().splitlines() if line for n in [line.split(",")[0]]
             if not n.startswith(prefixes)]
    files[record] = ("\n".join(lines) + "\n").encode()
    tmp = path.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        for name, data in files.items():
            dst.writestr(name, data)
    tmp.replace(path)
    return before, path.stat().st_size


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("wheel", type=Path)
    p.add_argument("--max-side", type=int, default=256)
    p.add_argument("--min-bytes", type=int, default=200_000, help="leave smaller PNGs as they are")
    p.add_argument("--drop", action="append", default=[], metavar="FOLDER",
                   help="leave this folder of the wheel out (repeatable), e.g. diffusers/pipelines")
    args = p.parse_args()
    before, after = slim(args.wheel, args.max_side, args.min_bytes, tuple(args.drop))
    print(f"{args.wheel.name}: {before / 2**20:.1f} MiB -> {after / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
