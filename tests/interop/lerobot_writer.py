"""Run INSIDE the LeRobot venv (.cache/lerobot-venv, `lerobot-dataset==0.4.4`), not wamkit's.

    python lerobot_writer.py write OUT_ROOT --episodes 6 --length 24 --height 64 --width 96 [layout flags]
    python lerobot_writer.py read OUT_ROOT WINDOWS_JSON DUMP_DIR --chunk 8
    python lerobot_writer.py bench OUT_ROOT --chunk 8 --workers 2 --num 64
    python lerobot_writer.py batch COMMANDS_JSON     (a list of the argument lists above, run in one process)

`write` builds a LeRobot v3.0 dataset with LeRobot's own writer (LeRobotDataset.create / add_frame /
save_episode / finalize): two cameras, tiny data/video file-size limits so episodes spread over several
files, AV1 (libsvtav1, LeRobot's default). Layout flags vary what LeRobot lets a user record: --vcodec
h264|hevc, --images (frames as PNG inside the parquet files), --chunks-size (several chunk dirs),
--sizes HxW,HxW (cameras of different sizes), --dtype float64, --state-dim 0 (no observation.state) or 1
and --action-dim 1 (shape [1] scalar columns), --extra (unused features), --task-switch (an episode
whose task changes halfway). `read` dumps LeRobot's own reading of windows
[(episode, start), ...] with delta_timestamps (state, action and each camera as .npy; pixels as
uint8; --tolerance-s relaxes LeRobot's frame-time check, for a file whose pixels are checked otherwise).
`bench` prints windows/s of LeRobotDataset through a torch DataLoader as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

# torchvision's PyPI wheel is CUDA-linked: with CPU torch its C ops do not load and its meta
# registrations fail on import. LeRobot only needs torchvision.transforms: declare the two ops
# (schema only, never called) so `import torchvision` succeeds.
for _op in ("nms", "qnms"):
    try:
        torch.library.define(f"torchvision::{_op}", "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    except RuntimeError:
        pass

from ledataset.datasets.lerobot_dataset import LeRobotDataset, LeRobotDatasetMetadata  # noqa: E402

CAMERAS = ("observation.images.front", "observation.images.wrist")
FPS = 10
TASKS = ("pick the cube", "open the drawer", "stack the blocks")


def frame(cam: int, ep: int, t: int, h: int, w: int) -> np.ndarray:
    """Smooth synthetic image (codec-friendly): gradients plus a moving soft disk."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    cx = (0.2 + 0.6 * ((t * 0.07 + ep * 0.13) % 1.0)) * w
    cy = (0.3 + 0.4 * ((t * 0.05 + cam * 0.3) % 1.0)) * h
    disk = np.clip(h * 0.15 - np.hypot(xx - cx, yy - cy), 0, 1)
    img = np.stack([40 + 120 * xx / w + 90 * disk, 60 + 100 * yy / h + cam * 40 - 50 * disk,
                    80 + 30 * ep % 100 + 120 * disk], -1)
    return np.clip(np.round(img), 0, 255).astype(np.uint8)


def vector(name: str, dim: int, dtype: str) -> dict:
    return {"dtype": dtype, "shape": (dim,), "names": [f"{name}{i}" for i in range(dim)]}


def layout_features(args) -> dict:
    """The features of one layout: cameras (video or image, per-camera sizes), state, action, extras."""
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",")] if args.sizes else \
        [(args.height, args.width)] * len(CAMERAS)
    kind = "image" if args.images else "video"
    features = {cam: {"dtype": kind, "shape": (h, w, 3), "names": ["height", "width", "channels"]}
                for cam, (h, w) in zip(CAMERAS, sizes)}
    if args.state_dim:
        features["observation.state"] = vector("s", args.state_dim, args.dtype)
    features["action"] = vector("a", args.action_dim, args.dtype)
    if args.extra:  # recorded, never used by wamkit
        features["observation.velocity"] = vector("v", 2, "float32")
        features["next.reward"] = {"dtype": "float32", "shape": (1,), "names": None}
        features["observation.index_hint"] = {"dtype": "int64", "shape": (1,), "names": None}
    return features


def episode_frame(args, features: dict, rng, ep: int, t: int, length: int) -> dict:
    row = {"task": TASKS[ep % len(TASKS)]}
    if args.task_switch and ep % 2 and t >= length // 2:
        row["task"] = "put it back"
    for key, ft in features.items():
        if ft["dtype"] in ("video", "image"):
            row[key] = frame(CAMERAS.index(key), ep, t, ft["shape"][0], ft["shape"][1])
        elif ft["dtype"] == "int64":
            row[key] = np.array([t], dtype=np.int64)
        else:
            row[key] = rng.standard_normal(ft["shape"]).astype(ft["dtype"])
    return row


def write(args) -> None:
    features = layout_features(args)
    ds = LeRobotDataset.create(repo_id="wamkit/interop", fps=FPS, features=features, root=args.out_root,
                               robot_type="synthetic", use_videos=not args.images, vcodec=args.vcodec)
    # tiny limits: episodes spread over several data parquet and mp4 files (and chunk dirs)
    ds.meta.update_chunk_settings(data_files_size_in_mb=args.data_mb, video_files_size_in_mb=args.video_mb,
                                  **({"chunks_size": args.chunks_size} if args.chunks_size else {}))
    rng = np.random.default_rng(0)
    for ep in range(args.episodes):
        length = args.length + 3 * ep
        for t in range(length):
            ds.add_frame(episode_frame(args, features, rng, ep, t, length))
        ds.save_episode()
    ds.finalize()
    print(json.dumps({"root": str(args.out_root), "episodes": args.episodes}))


def _open(root: Path, chunk: int, tolerance_s: float = 1e-4) -> LeRobotDataset:
    meta = LeRobotDatasetMetadata("wamkit/interop", root=root)
    frames = [k / FPS for k in range(chunk + 1)]
    delta = {"action": frames[:-1], **{cam: frames for cam in meta.camera_keys},
             **({"observation.state": frames} if "observation.state" in meta.features else {})}
    return LeRobotDataset("wamkit/interop", root=root, delta_timestamps=delta, tolerance_s=tolerance_s)


def _global_index(ds: LeRobotDataset, ep: int, start: int) -> int:
    return int(ds.meta.episodes["dataset_from_index"][ep]) + start


def read(args) -> None:
    ds = _open(Path(args.out_root), args.chunk, args.tolerance_s)
    out = Path(args.dump_dir)
    out.mkdir(parents=True, exist_ok=True)
    windows = json.loads(Path(args.windows_json).read_text())
    for n, (ep, start) in enumerate(windows):
        item = ds[_global_index(ds, ep, start)]
        assert int(item["episode_index"]) == ep, (item["episode_index"], ep)
        for key in ("observation.state", "action"):
            if key in ds.meta.features:
                assert not bool(item[f"{key}_is_pad"].any()), (ep, start, key)
                np.save(out / f"{n}_{key}.npy", item[key].numpy())
        for cam in ds.meta.camera_keys:
            pixels = (item[cam] * 255).round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1)  # [T+1,H,W,3]
            np.save(out / f"{n}_{cam}.npy", pixels.numpy())
        (out / f"{n}_task.txt").write_text(item["task"])
    print(json.dumps({"dumped": len(windows)}))


def bench(args) -> None:
    ds = _open(Path(args.out_root), args.chunk)
    starts = [_global_index(ds, ep, s) for ep in range(ds.meta.total_episodes)
              for s in range(0, int(ds.meta.episodes["length"][ep]) - args.chunk)]
    order = np.random.default_rng(0).permutation(starts)[: args.num + args.warmup].tolist()
    loader = torch.utils.data.DataLoader(ds, batch_size=1, num_workers=args.workers, sampler=order,
                                         collate_fn=lambda b: b, prefetch_factor=2 if args.workers else None)
    it = iter(loader)
    for _ in range(args.warmup):
        next(it)
    t0 = time.perf_counter()
    n = sum(1 for _ in it)
    dt = time.perf_counter() - t0
    print(json.dumps({"windows": n, "seconds": dt, "windows_per_s": n / dt}))


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("out_root")
    w.add_argument("--episodes", type=int, default=6)
    w.add_argument("--length", type=int, default=24)
    w.add_argument("--height", type=int, default=64)
    w.add_argument("--width", type=int, default=96)
    w.add_argument("--data-mb", type=float, default=0.002)
    w.add_argument("--video-mb", type=float, default=0.02)
    w.add_argument("--vcodec", default="libsvtav1", choices=["libsvtav1", "h264", "hevc"])
    w.add_argument("--images", action="store_true")
    w.add_argument("--chunks-size", type=int, default=0)
    w.add_argument("--sizes", default="")
    w.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    w.add_argument("--state-dim", type=int, default=4)
    w.add_argument("--action-dim", type=int, default=3)
    w.add_argument("--extra", action="store_true")
    w.add_argument("--task-switch", action="store_true")
    r = sub.add_parser("read")
    r.add_argument("out_root")
    r.add_argument("windows_json")
    r.add_argument("dump_dir")
    r.add_argument("--chunk", type=int, default=8)
    r.add_argument("--tolerance-s", type=float, default=1e-4)  # LeRobot's default
    b = sub.add_parser("bench")
    b.add_argument("out_root")
    b.add_argument("--chunk", type=int, default=8)
    b.add_argument("--workers", type=int, default=2)
    b.add_argument("--num", type=int, default=64)
    b.add_argument("--warmup", type=int, default=8)
    many = sub.add_parser("batch", help="run the commands of a JSON list of argument lists in this one process")
    many.add_argument("commands_json")
    args = p.parse_args(argv)
    if args.cmd == "batch":  # importing LeRobot costs ~10 s a process: the interop fixtures write and read in one each
        for command in json.loads(Path(args.commands_json).read_text()):
            main(command)
        return
    {"write": write, "read": read, "bench": bench}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
